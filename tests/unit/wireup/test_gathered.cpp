// Gathered, the result of an allgather: every rank's value in one buffer, read by rank.
#include <algorithm>

#include "catch.hpp"
#include "topolaunch/wireup/kv_store.hpp"

using namespace topolaunch::wireup;

namespace {
Bytes bytes_of(std::string_view text) {
  auto span = std::as_bytes(std::span(text.data(), text.size()));
  return Bytes(span.begin(), span.end());
}
}  // namespace

TEST_CASE("an empty Gathered has no values") {
  Gathered none;
  CHECK(none.size() == 0);
  CHECK(none.empty());
}

TEST_CASE("values pushed one at a time read back by rank, empty ones included") {
  Gathered gathered;
  gathered.reserve(3, 8);
  gathered.push_back(bytes_of("zero"));
  gathered.push_back({});
  gathered.push_back(bytes_of("two"));
  REQUIRE(gathered.size() == 3);
  CHECK(std::ranges::equal(gathered[0], bytes_of("zero")));
  CHECK(gathered[1].empty());
  CHECK(std::ranges::equal(gathered[2], bytes_of("two")));
}

TEST_CASE("a buffer and its offsets: value r lies between offsets r and r + 1") {
  Gathered gathered(bytes_of("aabbbc"), {0, 2, 5, 5, 6});
  REQUIRE(gathered.size() == 4);
  CHECK(std::ranges::equal(gathered[0], bytes_of("aa")));
  CHECK(std::ranges::equal(gathered[1], bytes_of("bbb")));
  CHECK(gathered[2].empty());
  CHECK(std::ranges::equal(gathered[3], bytes_of("c")));
}
