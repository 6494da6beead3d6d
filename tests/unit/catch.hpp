// Catch2 2.13 (Debian 12) and Catch2 3.x (the GPU host) spell their headers differently.
#pragma once
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#else
#include <catch2/catch.hpp>
#endif
