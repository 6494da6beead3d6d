#include "catch.hpp"
#include "topolaunch/common/units.hpp"

using namespace topolaunch;
using namespace std::chrono_literals;

TEST_CASE("sizes: binary suffixes, bare bytes and fractions") {
  CHECK(*parse_size_bytes("16GiB") == 16ull << 30);
  CHECK(*parse_size_bytes("25MiB") == 25ull << 20);
  CHECK(*parse_size_bytes("4KiB") == 4096);
  CHECK(*parse_size_bytes("1TiB") == 1ull << 40);
  CHECK(*parse_size_bytes("1.5GiB") == 3ull << 29);
  CHECK(*parse_size_bytes("512B") == 512);
  CHECK(*parse_size_bytes("4096") == 4096);
  CHECK(*parse_size_bytes("16 GiB") == 16ull << 30);
  CHECK(*parse_size_bytes("2G") == 2ull << 30);
}

TEST_CASE("sizes: decimal units are refused with the unit to use") {
  auto r = parse_size_bytes("16GB");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("\"16GB\" is not a size") != std::string::npos);
  CHECK(r.error().message.find("e.g. \"16GiB\"") != std::string::npos);
  CHECK(r.error().exit_code == 2);
}

TEST_CASE("sizes: garbage, negatives, fractions of a byte and overflow are refused") {
  CHECK_FALSE(parse_size_bytes("").ok());
  CHECK_FALSE(parse_size_bytes("lots").ok());
  CHECK_FALSE(parse_size_bytes("-1GiB").ok());
  CHECK_FALSE(parse_size_bytes("1.2.3GiB").ok());
  CHECK_FALSE(parse_size_bytes("0.5B").ok());
  CHECK_FALSE(parse_size_bytes("99999999999PiB").ok());
  CHECK_FALSE(parse_size_bytes("16gib").ok());
}

TEST_CASE("sizes: PiB is a unit (kernels' old parser refused it), a minus sign says negative") {
  CHECK(*parse_size_bytes("1PiB") == 1ull << 50);
  CHECK(*parse_size_bytes("0B") == 0);
  CHECK(parse_size_bytes("-3GiB").error().message ==
        "\"-3GiB\" is negative (a size is at least \"0B\")");
  CHECK(parse_duration("-5s").error().message ==
        "\"-5s\" is negative (a duration is at least \"0s\")");
}

TEST_CASE("durations: us, ms, s, m, h") {
  CHECK(*parse_duration("90s") == 90s);
  CHECK(*parse_duration("500ms") == 500ms);
  CHECK(*parse_duration("250us") == 250us);
  CHECK(*parse_duration("5m") == 5min);
  CHECK(*parse_duration("5min") == 5min);
  CHECK(*parse_duration("1h") == 1h);
  CHECK(*parse_duration("1.5s") == 1500ms);
  CHECK(*parse_duration("0s") == 0s);
}

TEST_CASE("durations: a bare number has no unit and is refused") {
  auto r = parse_duration("90");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("\"90\" has no unit") != std::string::npos);
  CHECK_FALSE(parse_duration("ninety seconds").ok());
  CHECK_FALSE(parse_duration("-5s").ok());
  CHECK_FALSE(parse_duration("5 fortnights").ok());
}

TEST_CASE("sizes and durations print the way people write them") {
  CHECK(format_size(16ull << 30) == "16GiB");
  CHECK(format_size(1536) == "1.5KiB");
  CHECK(format_size(0) == "0B");
  CHECK(format_size(100) == "100B");
  CHECK(format_duration(90s) == "90s");
  CHECK(format_duration(1500ms) == "1.5s");
  CHECK(format_duration(250us) == "250us");
  CHECK(format_duration(0s) == "0s");
}
