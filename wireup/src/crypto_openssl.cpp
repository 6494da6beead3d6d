#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>

#include "crypto.hpp"

namespace topolaunch::wireup::crypto_openssl {

std::string_view library() { return "OpenSSL libcrypto"; }

Bytes hmac_sha256(std::string_view key, std::span<const std::byte> message) {
  Bytes mac(EVP_MAX_MD_SIZE);
  unsigned int mac_bytes = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(),
           reinterpret_cast<unsigned char*>(mac.data()), &mac_bytes) == nullptr) {
    throw std::runtime_error("openssl hmac-sha256 failed");  // only on allocation failure
  }
  mac.resize(mac_bytes);
  return mac;
}

std::array<std::byte, 32> sha256(std::span<const std::byte> data) {
  std::array<std::byte, 32> digest{};
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), reinterpret_cast<unsigned char*>(digest.data()), &length,
                 EVP_sha256(), nullptr) != 1 ||
      length != digest.size()) {
    throw std::runtime_error("openssl sha-256 failed");
  }
  return digest;
}

void random_bytes(std::span<std::byte> out) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1) {
    throw std::runtime_error("openssl RAND_bytes failed: no entropy");
  }
}

bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace topolaunch::wireup::crypto_openssl
