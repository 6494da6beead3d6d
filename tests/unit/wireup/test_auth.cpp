// The secret check: HMAC-SHA256 is the real thing, and proofs depend on every input. And the
// crypto primitives behind it and the fingerprints (wireup/src/crypto.hpp), in each
// implementation built here: RFC 4231 and FIPS 180-2 vectors, fresh random bytes, the
// constant-time compare. The build host has both libraries; the GPU hosts build libcrypto's.
#include <string>

#include "auth.hpp"
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
Bytes bytes_of(std::string_view text) {
  auto span = std::as_bytes(std::span(text.data(), text.size()));
  return Bytes(span.begin(), span.end());
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

TEST_CASE("hmac-sha256 matches RFC 4231 test cases 1 and 2") {
  // Test case 2: key "Jefe", data "what do ya want for nothing?".
  CHECK(hex(auth::hmac_sha256("Jefe", bytes_of("what do ya want for nothing?"))) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 1: key 0x0b * 20, data "Hi There".
  CHECK(hex(auth::hmac_sha256(std::string(20, '\x0b'), bytes_of("Hi There"))) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST_CASE("a client proof verifies only with the same secret, nonce, rank and world size") {
  auto nonce = auth::random_nonce();
  auto proof = auth::client_proof("job-secret", nonce, 3, 8);
  CHECK(auth::equal_constant_time(proof, auth::client_proof("job-secret", nonce, 3, 8)));
  CHECK_FALSE(auth::equal_constant_time(proof, auth::client_proof("job-secreT", nonce, 3, 8)));
  CHECK_FALSE(auth::equal_constant_time(
      proof, auth::client_proof("job-secret", auth::random_nonce(), 3, 8)));
  CHECK_FALSE(auth::equal_constant_time(proof, auth::client_proof("job-secret", nonce, 4, 8)));
  CHECK_FALSE(auth::equal_constant_time(proof, auth::client_proof("job-secret", nonce, 3, 9)));
  // The server's proof over the same nonce is a different message: no reflection.
  CHECK_FALSE(auth::equal_constant_time(proof, auth::server_proof("job-secret", nonce)));
}

TEST_CASE("nonces are fresh and of the protocol's size") {
  auto a = auth::random_nonce();
  auto b = auth::random_nonce();
  CHECK(a.size() == 32);
  CHECK(a != b);
  CHECK_FALSE(auth::equal_constant_time(a, Bytes(a.begin(), a.end() - 1)));
}

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
