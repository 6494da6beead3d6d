// Private: the challenge/response that proves knowledge of the per-job secret (HMAC-SHA256,
// crypto.hpp). Both sides prove it: the client over the server's nonce (with its rank and
// world size bound in), the server over the client's nonce, so neither talks to an impostor.
#pragma once

#include <span>
#include <string_view>

#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::wireup::auth {

Bytes hmac_sha256(std::string_view secret, std::span<const std::byte> message);
Bytes random_nonce();  // proto::kNonceBytes from the OS CSPRNG
bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b);

Bytes client_proof(std::string_view secret, std::span<const std::byte> server_nonce,
                   std::int64_t rank, std::int64_t world_size);
Bytes server_proof(std::string_view secret, std::span<const std::byte> client_nonce);

}  // namespace topolaunch::wireup::auth
