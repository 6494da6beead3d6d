#include <fmt/format.h>
#include <cstring>

#include "topolaunch/rdma/blob.hpp"
#include "topolaunch/rdma/endpoint.hpp"

namespace topolaunch::rdma {

std::string serialize(const RemoteMemory& m) {
  std::string out(16, '\0');
  const std::uint64_t bytes = m.bytes;
  std::memcpy(out.data(), &m.address, 8);
  std::memcpy(out.data() + 8, &bytes, 8);
  return out + m.packed_key;
}

Result<RemoteMemory> parse_remote_memory(std::string_view payload, int peer, std::string_view key) {
  if (payload.size() < 16)
    return make_error(fmt::format("corrupted memory key from rank {} (store key \"{}\"): {} bytes",
                                  peer, key, payload.size()),
                      2);
  RemoteMemory m;
  std::uint64_t bytes = 0;
  std::memcpy(&m.address, payload.data(), 8);
  std::memcpy(&bytes, payload.data() + 8, 8);
  m.bytes = bytes;
  m.packed_key = std::string(payload.substr(16));
  return m;
}

RemoteMemory describe(const LocalMemory& m) {
  return {reinterpret_cast<std::uint64_t>(m.address), m.bytes, m.packed_key};
}

Status connect_peers(Transport& transport, wireup::KvStore& store, const std::vector<int>& peers,
                     const std::string& name, std::chrono::milliseconds timeout) {
  const int me = store.rank();
  for (int peer : peers) {
    auto blob = transport.local_blob(peer);
    if (!blob) return blob.error();
    if (auto st = store.put(fmt::format("{}/ep/{}/{}", name, me, peer),
                            encode_blob(BlobKind::verbs_qp, me, *blob));
        !st)
      return st;
  }
  if (auto st = store.fence(timeout); !st) return st;
  for (int peer : peers) {
    const std::string key = fmt::format("{}/ep/{}/{}", name, peer, me);
    auto raw = store.get_string(key, timeout);
    if (!raw) return raw.error();
    auto payload = decode_blob(*raw, BlobKind::verbs_qp, peer, key);
    if (!payload) return payload.error();
    if (auto st = transport.connect(peer, *payload); !st) return st;
  }
  return ok_status();
}

}  // namespace topolaunch::rdma
