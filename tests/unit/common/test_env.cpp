// The strict environment reader: a set but malformed integer names the variable and its value
// (exit 2); absent or empty is the default.
#include <stdlib.h>

#include <string>

#include "catch.hpp"
#include "topolaunch/common/env.hpp"

using namespace topolaunch;

namespace {

std::string error_of(const Result<int>& r) {
  if (r.ok()) return "(read " + std::to_string(*r) + ")";
  CHECK(r.error().exit_code == 2);
  return r.error().message;
}

}  // namespace

TEST_CASE("env_int: absent or empty is the default, digits are the value") {
  const Environment env{{"A", "12"}, {"EMPTY", ""}, {"NEG", "-1"}};
  CHECK(*env_int(env, "MISSING", 7) == 7);
  CHECK(*env_int(env, "EMPTY", 7) == 7);
  CHECK(*env_int(env, "A", 7) == 12);
  CHECK(*env_int(env, "NEG", 0, -1) == -1);
  CHECK(*env_int(env, "MISSING", -1, 0) == -1);  // the default is the caller's, not checked
}

TEST_CASE("env_int: what atoi would read as a number is refused with the name and the value") {
  const Environment env{{"LOCAL_RANK", "1x"}, {"WORLD_SIZE", "two"}, {"RANK", " 3"},
                        {"PORT", "+80"},      {"SIZE", "4.0"},       {"BIG", "99999999999"}};
  CHECK(error_of(env_int(env, "LOCAL_RANK", 0)) == "LOCAL_RANK=1x: not an integer");
  CHECK(error_of(env_int(env, "WORLD_SIZE", 1, 1)) == "WORLD_SIZE=two: not an integer");
  CHECK(error_of(env_int(env, "RANK", 0)) == "RANK= 3: not an integer");
  CHECK(error_of(env_int(env, "PORT", 0)) == "PORT=+80: not an integer");
  CHECK(error_of(env_int(env, "SIZE", 0)) == "SIZE=4.0: not an integer");
  CHECK(error_of(env_int(env, "BIG", 0)) == "BIG=99999999999: out of range (at least 0)");
}

TEST_CASE("env_int: the range is checked and said") {
  const Environment env{{"WORLD_SIZE", "0"}, {"RANK", "-2"}, {"PORT", "70000"}};
  CHECK(error_of(env_int(env, "WORLD_SIZE", 1, 1)) == "WORLD_SIZE=0: out of range (at least 1)");
  CHECK(error_of(env_int(env, "RANK", 0)) == "RANK=-2: out of range (at least 0)");
  CHECK(error_of(env_int(env, "PORT", 0, 0, 65535)) ==
        "PORT=70000: out of range (allowed 0..65535)");
}

TEST_CASE("the process environment reads the same way") {
  ::setenv("TOPOLAUNCH_TEST_ENV_INT", "5y", 1);
  CHECK(error_of(env_int("TOPOLAUNCH_TEST_ENV_INT", 0)) ==
        "TOPOLAUNCH_TEST_ENV_INT=5y: not an integer");
  ::setenv("TOPOLAUNCH_TEST_ENV_INT", "5", 1);
  CHECK(*env_int("TOPOLAUNCH_TEST_ENV_INT", 0) == 5);
  CHECK(current_environment().at("TOPOLAUNCH_TEST_ENV_INT") == "5");
  CHECK(*env_value("TOPOLAUNCH_TEST_ENV_INT") == "5");
  ::setenv("TOPOLAUNCH_TEST_ENV_INT", "", 1);
  CHECK_FALSE(env_value("TOPOLAUNCH_TEST_ENV_INT").has_value());
  CHECK(*env_int("TOPOLAUNCH_TEST_ENV_INT", 9) == 9);
  ::unsetenv("TOPOLAUNCH_TEST_ENV_INT");
  CHECK_FALSE(env_value("TOPOLAUNCH_TEST_ENV_INT").has_value());
}
