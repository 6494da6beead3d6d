// Binary values through PMI2's short text values: base64url and splitting across keys.
#include <map>
#include <random>

#include "catch.hpp"
#include "pmi2_codec.hpp"

using namespace topolaunch::wireup;

namespace {
Bytes random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::byte>(gen() & 0xff);
  return out;
}
Bytes bytes_of(std::string_view text) {
  auto span = std::as_bytes(std::span(text.data(), text.size()));
  return Bytes(span.begin(), span.end());
}
}  // namespace

TEST_CASE("base64url matches RFC 4648 vectors, without padding") {
  CHECK(pmi2::base64url_encode(bytes_of("")) == "");
  CHECK(pmi2::base64url_encode(bytes_of("f")) == "Zg");
  CHECK(pmi2::base64url_encode(bytes_of("fo")) == "Zm8");
  CHECK(pmi2::base64url_encode(bytes_of("foo")) == "Zm9v");
  CHECK(pmi2::base64url_encode(bytes_of("foobar")) == "Zm9vYmFy");
  CHECK(pmi2::base64url_encode(Bytes{std::byte{0xfb}, std::byte{0xff}}) ==
        "-_8");  // url-safe alphabet
}

TEST_CASE("base64url round-trips every length and byte value") {
  for (std::size_t n = 0; n < 70; ++n) {
    auto data = random_bytes(n, static_cast<unsigned>(n));
    auto text = pmi2::base64url_encode(data);
    CHECK(text.find_first_of("=;+/ ") == std::string::npos);
    auto back = pmi2::base64url_decode(text);
    REQUIRE(back.ok());
    CHECK(*back == data);
  }
}

TEST_CASE("base64url refuses text it did not write") {
  CHECK_FALSE(pmi2::base64url_decode("Zm9v=").ok());  // padding is not ours
  CHECK_FALSE(pmi2::base64url_decode("Z").ok());      // impossible length
  CHECK_FALSE(pmi2::base64url_decode("Zh").ok());     // stray bits ("f" is "Zg")
  CHECK_FALSE(pmi2::base64url_decode("Zm;v").ok());
  // A peer's text is named, not echoed: a newline would split the log line (fuzz_pmi2_codec).
  auto newline = pmi2::base64url_decode("Zm\nv");
  REQUIRE_FALSE(newline.ok());
  CHECK(newline.error().message == "pmi2 value: byte 0x0a is not a base64url character");
  CHECK(pmi2::base64url_decode("Zm;v").error().message ==
        "pmi2 value: ';' is not a base64url character");
}

TEST_CASE("a 4 KiB value splits into chunks that fit PMI2's limits and joins back") {
  auto value = random_bytes(4096, 42);
  auto entries = pmi2::split_value("ucx/17", value);
  REQUIRE(entries.ok());
  CHECK(entries->size() == 6);  // 5462 chars at 988 per chunk
  CHECK((*entries)[0].key == "ucx/17");
  CHECK((*entries)[1].key == "ucx/17#1");
  std::map<std::string, std::string> kvs;
  for (const auto& entry : *entries) {
    CHECK(entry.key.size() <= pmi2::kMaxKeyChars);
    CHECK(entry.value.size() <= pmi2::kMaxValueChars);
    CHECK(entry.value.find_first_of("=; ") == std::string::npos);
    kvs[entry.key] = entry.value;
  }
  auto joined = pmi2::join_value("ucx/17", kvs.at("ucx/17"), [&](const std::string& key) {
    return topolaunch::Result<std::string>(kvs.at(key));
  });
  REQUIRE(joined.ok());
  CHECK(*joined == value);
}

TEST_CASE("small and empty values take one key") {
  for (auto n : {0, 1, 100, 700}) {
    auto value = random_bytes(static_cast<std::size_t>(n), 7);
    auto entries = pmi2::split_value("k", value);
    REQUIRE(entries.ok());
    REQUIRE(entries->size() == 1);
    auto joined = pmi2::join_value("k", (*entries)[0].value, [](const std::string& key) {
      return topolaunch::Result<std::string>(topolaunch::make_error("unexpected chunk " + key));
    });
    REQUIRE(joined.ok());
    CHECK(*joined == value);
  }
}

TEST_CASE("keys that cannot fit PMI2 are refused with the reason") {
  auto long_key = std::string(62, 'k');
  auto big = pmi2::split_value(long_key, random_bytes(4096, 1));
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().message.find("too long") != std::string::npos);
  CHECK(pmi2::split_value(long_key, random_bytes(10, 1)).ok());  // one chunk, no suffix
  CHECK_FALSE(pmi2::split_value("a=b", {}).ok());
  CHECK_FALSE(pmi2::split_value("", {}).ok());
}

TEST_CASE("a missing chunk or a foreign header is an error, not garbage") {
  auto entries = pmi2::split_value("blob", random_bytes(3000, 3));
  REQUIRE(entries.ok());
  auto missing = pmi2::join_value("blob", (*entries)[0].value, [](const std::string& key) {
    return topolaunch::Result<std::string>(topolaunch::make_error("no key " + key));
  });
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message == "no key blob#1");
  auto never = [](const std::string&) { return topolaunch::Result<std::string>(std::string()); };
  CHECK_FALSE(pmi2::join_value("blob", "hello", never).ok());
  CHECK_FALSE(pmi2::join_value("blob", "0:", never).ok());
}
