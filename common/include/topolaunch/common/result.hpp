// Result<T>: a value or an Error that says what failed, where, and (often) what to do.
// Functions that can fail on input return it instead of throwing through layers
// (C++20 has no std::expected yet on g++ 12).
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace topolaunch {

struct Error {
  std::string message;  // one line, lower case, specific: "job.toml:12:9: budget.gpu_memory: ..."
  int exit_code = 2;    // what a command line program should exit with (2 = bad input / usage)
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Error error) : v_(std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// For functions that return nothing but can fail.
struct Ok {};
using Status = Result<Ok>;
inline Status ok_status() { return Ok{}; }

inline Error make_error(std::string message, int exit_code = 2) {
  return Error{std::move(message), exit_code};
}

}  // namespace topolaunch
