// The secret check: HMAC-SHA256 is the real thing, and proofs depend on every input.
#include "auth.hpp"
#include "catch.hpp"

using namespace topolaunch::wireup;

namespace {
std::string hex(const Bytes& bytes) {
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
