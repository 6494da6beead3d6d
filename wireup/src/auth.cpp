#include "auth.hpp"

#include "crypto.hpp"
#include "frame.hpp"

namespace topolaunch::wireup::auth {

Bytes hmac_sha256(std::string_view secret, std::span<const std::byte> message) {
  return crypto::hmac_sha256(secret, message);
}

Bytes random_nonce() {
  Bytes nonce(proto::kNonceBytes);
  crypto::random_bytes(nonce);
  return nonce;
}

bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) {
  return crypto::equal_constant_time(a, b);
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
