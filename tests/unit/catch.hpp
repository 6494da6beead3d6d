// Catch2 2.13 (Debian 12) and Catch2 3.x (the GPU hosts) spell their headers and a few names
// differently; the tests use 2.13's names, which this header gives under 3.x too.
#pragma once
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <string>
using Catch::Approx;
namespace Catch {
// 2.13's string matchers; 3.x's Matchers::Contains matches ranges, not substrings
inline Matchers::StringContainsMatcher Contains(const std::string& text) {
  return Matchers::ContainsSubstring(text);
}
using Matchers::EndsWith;
using Matchers::StartsWith;
}  // namespace Catch
#else
#include <catch2/catch.hpp>
#endif
