// The environment, read strictly. A variable that is set but malformed is an error naming the
// variable and its value ("LOCAL_RANK=1x: not an integer", exit 2), never atoi's silent 0 or a
// quiet fallback to the default; absent or empty means the caller's default.
#pragma once

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "topolaunch/common/result.hpp"

namespace topolaunch {

// A process environment as name -> value (what a child is started with, what SPANK hands us).
using Environment = std::map<std::string, std::string>;

// This process's environment (environ).
Environment current_environment();

// The value of `name`; nullopt when it is absent or empty.
std::optional<std::string> env_value(const Environment& env, std::string_view name);
std::optional<std::string> env_value(const char* name);  // this process's environment

// `name` as a decimal integer in [min, max]; `absent` when it is absent or empty. Anything else
// (signs other than a leading '-', blanks, suffixes, overflow, out of range) is an Error with
// exit code 2 whose message starts with "NAME=value: ".
Result<int> env_int(const Environment& env, std::string_view name, int absent, int min = 0,
                    int max = std::numeric_limits<int>::max());
Result<int> env_int(const char* name, int absent, int min = 0,
                    int max = std::numeric_limits<int>::max());  // this process's environment

}  // namespace topolaunch
