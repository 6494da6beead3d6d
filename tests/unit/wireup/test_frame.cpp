// The TCP store's wire format: frames round-trip, and anything malformed is refused.
#include <algorithm>

#include "catch.hpp"
#include "frame.hpp"

using namespace topolaunch::wireup;
using proto::Op;

namespace {
Bytes bytes_of(std::string_view text) {
  auto span = std::as_bytes(std::span(text.data(), text.size()));
  return Bytes(span.begin(), span.end());
}
}  // namespace

TEST_CASE("a frame round-trips its op and binary payload, NULs and high bytes included") {
  Bytes value{std::byte{0}, std::byte{0xff}, std::byte{'='}, std::byte{0}, std::byte{0x80}};
  auto payload =
      proto::PayloadWriter().str("nccl/id/3").bytes(value).u64(1234567890123ull).i64(-5).take();
  auto frame = proto::encode_frame(Op::set, payload);
  REQUIRE(frame.size() == proto::kHeaderBytes + payload.size());

  auto header = proto::decode_header(frame, 1 << 20);
  REQUIRE(header.ok());
  CHECK(header->op == Op::set);
  CHECK(header->payload_bytes == payload.size());

  proto::PayloadReader in{std::span(frame).subspan(proto::kHeaderBytes)};
  CHECK(in.str() == std::optional<std::string>("nccl/id/3"));
  auto got = in.bytes();
  REQUIRE(got.has_value());
  CHECK(Bytes(got->begin(), got->end()) == value);
  CHECK(in.u64() == std::optional<std::uint64_t>(1234567890123ull));
  CHECK(in.i64() == std::optional<std::int64_t>(-5));
  CHECK(in.at_end());
}

TEST_CASE("an empty value is a value, not an absence") {
  auto payload = proto::PayloadWriter().bytes({}).take();
  proto::PayloadReader in(payload);
  auto got = in.bytes();
  REQUIRE(got.has_value());
  CHECK(got->empty());
  CHECK(in.at_end());
}

TEST_CASE("a gathered reply round-trips every rank's value in order, empty ones included") {
  Bytes a = bytes_of("rank zero"), b, c{std::byte{0}, std::byte{0xff}};
  auto gathered = proto::decode_gathered(proto::encode_gathered({&a, &b, &c}), 3);
  REQUIRE(gathered.has_value());
  REQUIRE(gathered->size() == 3);
  CHECK(std::ranges::equal((*gathered)[0], a));
  CHECK((*gathered)[1].empty());
  CHECK(std::ranges::equal((*gathered)[2], c));
}

TEST_CASE("a gathered reply decodes in place: its values lie back to back in one buffer") {
  Bytes a = bytes_of("first"), b = bytes_of("second"), c = bytes_of("third");
  auto gathered = proto::decode_gathered(proto::encode_gathered({&a, &b, &c}), 3);
  REQUIRE(gathered.has_value());
  CHECK((*gathered)[0].data() + a.size() == (*gathered)[1].data());
  CHECK((*gathered)[1].data() + b.size() == (*gathered)[2].data());
  CHECK(std::ranges::equal((*gathered)[1], b));
}

TEST_CASE("a get_many reply decodes into one vector per value") {
  Bytes a = bytes_of("abc"), b;
  auto values = proto::decode_values(proto::encode_gathered({&a, &b}), 2);
  REQUIRE(values.has_value());
  CHECK(*values == std::vector<Bytes>{a, b});
}

TEST_CASE("a gathered reply with another count, a short value or trailing bytes is refused") {
  Bytes a = bytes_of("abc");
  auto payload = proto::encode_gathered({&a, &a});
  CHECK_FALSE(proto::decode_gathered(payload, 3).has_value());
  CHECK_FALSE(proto::decode_gathered(Bytes(payload.begin(), payload.end() - 1), 2).has_value());
  auto longer = payload;
  longer.push_back(std::byte{0});
  CHECK_FALSE(proto::decode_gathered(longer, 2).has_value());
  CHECK_FALSE(proto::decode_values(longer, 2).has_value());
}

TEST_CASE("headers with a wrong magic, version or op, or too large, are refused with a reason") {
  auto good = proto::encode_frame(Op::get, bytes_of("abcd"));

  SECTION("wrong magic (e.g. an HTTP client)") {
    auto http = bytes_of("GET / HTTP/1.1\r\n");
    auto r = proto::decode_header(http, 1 << 20);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("magic") != std::string::npos);
  }
  SECTION("another protocol version (1: before allgather and relays)") {
    auto frame = good;
    frame[4] = std::byte{1};
    auto r = proto::decode_header(frame, 1 << 20);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("version 1") != std::string::npos);
  }
  SECTION("unknown op") {
    auto frame = good;
    frame[6] = std::byte{0x77};
    auto r = proto::decode_header(frame, 1 << 20);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("unknown frame op") != std::string::npos);
  }
  SECTION("payload above the limit") {
    auto r = proto::decode_header(good, 3);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("exceeds the limit of 3") != std::string::npos);
  }
  SECTION("short header") {
    CHECK_FALSE(proto::decode_header(std::span(good).first(5), 1 << 20).ok());
  }
}

TEST_CASE("a payload reader never reads past the payload") {
  auto payload = proto::PayloadWriter().str("key").u64(7).take();

  SECTION("truncated string") {
    proto::PayloadReader in{std::span(payload).first(5)};
    CHECK_FALSE(in.str().has_value());
  }
  SECTION("a length prefix larger than the payload") {
    Bytes lying{std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0x7f}, std::byte{'x'}};
    proto::PayloadReader in(lying);
    CHECK_FALSE(in.bytes().has_value());
  }
  SECTION("truncated integer") {
    proto::PayloadReader in(payload);
    REQUIRE(in.str().has_value());
    proto::PayloadReader short_int{std::span(payload).first(payload.size() - 1)};
    REQUIRE(short_int.str().has_value());
    CHECK_FALSE(short_int.u64().has_value());
  }
}
