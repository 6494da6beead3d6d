#include "auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>

#include "frame.hpp"

namespace topolaunch::wireup::auth {

Bytes hmac_sha256(std::string_view secret, std::span<const std::byte> message) {
  Bytes mac(EVP_MAX_MD_SIZE);
  unsigned int mac_bytes = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(),
           reinterpret_cast<unsigned char*>(mac.data()), &mac_bytes) == nullptr) {
    throw std::runtime_error("openssl hmac-sha256 failed");  // only on allocation failure
  }
  mac.resize(mac_bytes);
  return mac;
}

Bytes random_nonce() {
  Bytes nonce(proto::kNonceBytes);
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) !=
      1) {
    throw std::runtime_error("openssl RAND_bytes failed: no entropy");
  }
  return nonce;
}

bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Bytes client_proof(std::string_view secret, std::span<const std::byte> server_nonce,
                   std::int64_t rank, std::int64_t world_size) {
  proto::PayloadWriter message;
  message.str("topolaunch-wireup-v1 client").bytes(server_nonce).i64(rank).i64(world_size);
  return hmac_sha256(secret, message.data());
}

Bytes server_proof(std::string_view secret, std::span<const std::byte> client_nonce) {
  proto::PayloadWriter message;
  message.str("topolaunch-wireup-v1 server").bytes(client_nonce);
  return hmac_sha256(secret, message.data());
}

}  // namespace topolaunch::wireup::auth
