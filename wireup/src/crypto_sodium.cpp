#include <sodium.h>

#include <stdexcept>

#include "crypto.hpp"

namespace topolaunch::wireup::crypto_sodium {
namespace {

const unsigned char* uchars(const void* p) { return static_cast<const unsigned char*>(p); }

void initialize() {
  // Thread-safe and idempotent; it picks the CPU's code paths and the random source.
  static const bool ready = sodium_init() >= 0;
  if (!ready) throw std::runtime_error("libsodium: sodium_init failed");
}

}  // namespace

std::string_view library() { return "libsodium"; }

Bytes hmac_sha256(std::string_view key, std::span<const std::byte> message) {
  initialize();
  crypto_auth_hmacsha256_state state;
  Bytes mac(crypto_auth_hmacsha256_BYTES);
  // The streaming form takes a key of any length (the one-shot form wants exactly 32 bytes).
  crypto_auth_hmacsha256_init(&state, uchars(key.data()), key.size());
  crypto_auth_hmacsha256_update(&state, uchars(message.data()), message.size());
  crypto_auth_hmacsha256_final(&state, reinterpret_cast<unsigned char*>(mac.data()));
  sodium_memzero(&state, sizeof state);
  return mac;
}

std::array<std::byte, 32> sha256(std::span<const std::byte> data) {
  initialize();
  std::array<std::byte, 32> digest{};
  static_assert(crypto_hash_sha256_BYTES == 32);
  crypto_hash_sha256(reinterpret_cast<unsigned char*>(digest.data()), uchars(data.data()),
                     data.size());
  return digest;
}

void random_bytes(std::span<std::byte> out) {
  initialize();
  randombytes_buf(out.data(), out.size());
}

bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || sodium_memcmp(a.data(), b.data(), a.size()) == 0);
}

}  // namespace topolaunch::wireup::crypto_sodium
