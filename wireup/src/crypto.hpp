// Private: the primitives behind the secret check and the topology fingerprints, from one of two
// libraries chosen at configure time (meson.build): libsodium where it is installed, OpenSSL's
// libcrypto otherwise (the GPU hosts have only that). Every process of a job makes one HMAC
// at least: with libsodium that costs ~0.04 ms of CPU, with libcrypto ~1.5 ms (loading its
// ~4,200 symbol relocations eagerly, then its first digest fetch), 32 agents x 1.5 ms on the
// 2-core CI host at each launch of 32 emulated nodes.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string_view>

#include "topolaunch/wireup/kv_store.hpp"

// Each implementation lives in its own namespace, so that a test can build both into one binary.
namespace topolaunch::wireup::crypto_sodium {
std::string_view library();
Bytes hmac_sha256(std::string_view key, std::span<const std::byte> message);
std::array<std::byte, 32> sha256(std::span<const std::byte> data);
void random_bytes(std::span<std::byte> out);  // the OS CSPRNG; throws only without entropy
bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b);
}  // namespace topolaunch::wireup::crypto_sodium

namespace topolaunch::wireup::crypto_openssl {
std::string_view library();
Bytes hmac_sha256(std::string_view key, std::span<const std::byte> message);
std::array<std::byte, 32> sha256(std::span<const std::byte> data);
void random_bytes(std::span<std::byte> out);
bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b);
}  // namespace topolaunch::wireup::crypto_openssl

namespace topolaunch::wireup {
#if defined(TOPOLAUNCH_CRYPTO_SODIUM)
namespace crypto = crypto_sodium;
#elif defined(TOPOLAUNCH_CRYPTO_OPENSSL)
namespace crypto = crypto_openssl;
#else
#error "wireup: configure chose no crypto library (TOPOLAUNCH_CRYPTO_SODIUM or _OPENSSL)"
#endif
}  // namespace topolaunch::wireup
