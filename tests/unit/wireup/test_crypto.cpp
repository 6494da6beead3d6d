// The crypto primitives behind the secret check and the fingerprints (wireup/src/crypto.hpp), in
// each implementation built here: RFC 4231 and FIPS 180-2 vectors, fresh random bytes, the
// constant-time compare. The build host has both libraries; the GPU hosts build libcrypto's.
#include <string>

#include "catch.hpp"
#include "crypto.hpp"
#include "topolaunch/wireup/digest.hpp"

using namespace topolaunch::wireup;

namespace {

template <class Bytesish>
std::string hex(const Bytesish& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (auto b : bytes) {
    out += digits[std::to_integer<int>(b) >> 4];
    out += digits[std::to_integer<int>(b) & 15];
  }
  return out;
}

std::span<const std::byte> bytes_of(std::string_view text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

#define TOPOLAUNCH_CRYPTO_CASES(ns)                                                   \
  SECTION(std::string(ns::library())) {                                               \
    /* RFC 4231 test case 6: a key longer than the block (131 bytes of 0xaa). */      \
    CHECK(hex(ns::hmac_sha256(                                                        \
              std::string(131, '\xaa'),                                               \
              bytes_of("Test Using Larger Than Block-Size Key - Hash Key First"))) == \
          "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");        \
    /* RFC 4231 test case 2. */                                                       \
    CHECK(hex(ns::hmac_sha256("Jefe", bytes_of("what do ya want for nothing?"))) ==   \
          "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");        \
    /* FIPS 180-2: "abc", and the empty message. */                                   \
    CHECK(hex(ns::sha256(bytes_of("abc"))) ==                                         \
          "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");        \
    CHECK(hex(ns::sha256(bytes_of(""))) ==                                            \
          "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");        \
    Bytes a(32), b(32);                                                               \
    ns::random_bytes(a);                                                              \
    ns::random_bytes(b);                                                              \
    CHECK(a != b);                                                                    \
    CHECK(a != Bytes(32));                                                            \
    CHECK(ns::equal_constant_time(a, Bytes(a)));                                      \
    CHECK_FALSE(ns::equal_constant_time(a, b));                                       \
    CHECK_FALSE(ns::equal_constant_time(a, std::span<const std::byte>(a).first(31))); \
    CHECK(ns::equal_constant_time(Bytes{}, Bytes{}));                                 \
  }

}  // namespace

TEST_CASE("each crypto implementation built here meets the published test vectors") {
  int built = 0;
#if defined(TOPOLAUNCH_TEST_CRYPTO_SODIUM)
  ++built;
  TOPOLAUNCH_CRYPTO_CASES(crypto_sodium)
#endif
#if defined(TOPOLAUNCH_TEST_CRYPTO_OPENSSL)
  ++built;
  TOPOLAUNCH_CRYPTO_CASES(crypto_openssl)
#endif
  CHECK(built >= 1);
}

TEST_CASE("sha256_hex: the digest's leading bytes as hex, from the library the store uses") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abc", 16) == "ba7816bf8f01cfea414140de5dae2223");
  CHECK(sha256_hex("abc", 64).size() == 64);  // capped at the digest's 32 bytes
  CHECK(std::string(crypto::library()).size() > 0);
}
