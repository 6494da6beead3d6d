// One rank of the verbs RDMA WRITE check (rdma suite, inside the Soft-RoCE guest): every rank
// opens our verbs transport on its device, registers a source buffer filled with its own
// pattern, has the transport allocate a zeroed target buffer, publishes the target's key
// through a directory store, connects an RC QP to the next rank (connect_peers: QP blobs through
// the store) and RDMA-writes its whole source into the next rank's target: large pieces, then
// small ones at odd offsets and lengths. After a fence every rank checks its target byte for
// byte against the previous rank's pattern. Prints one JSON line; exit 0 = every byte right,
// 1 = mismatch or transport failure, 2 = bad input (a device that does not exist, a port that
// is down).
//   verbs_write_check --dir D --rank R --world N --device DEV[,DEV...] [--port P] [--gid G]
//                     [--bytes N] [--timeout-ms T] [--qp-timeout T] [--unreachable-gid IPV6]
// A device list gives rank r the r-th device. --unreachable-gid (world 1): the QP is connected
// to our own QP number at that GID instead, where nobody answers; the write must fail with the
// transport's retry error, naming the peer, within the QP timeout's retries (no hang).
#include <arpa/inet.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "topolaunch/rdma/blob.hpp"
#include "topolaunch/rdma/endpoint.hpp"
#include "topolaunch/rdma/store.hpp"
#include "topolaunch/rdma/verbs_qp.hpp"

using namespace topolaunch;
using namespace topolaunch::rdma;
using Clock = std::chrono::steady_clock;

namespace {

// A pattern that differs per rank and per byte position (so a shifted or misplaced write shows).
unsigned char pattern(int rank, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull + i;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<unsigned char>(x);
}

int report(nlohmann::json j, int code) {
  j["exit"] = code;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, devices, unreachable_gid;
  int rank = -1, world = 0;
  VerbsTransportOptions opts;
  std::size_t bytes = std::size_t{8} << 20;
  std::chrono::milliseconds timeout{20'000};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir")
      dir = v;
    else if (k == "--rank")
      rank = std::atoi(v.c_str());
    else if (k == "--world")
      world = std::atoi(v.c_str());
    else if (k == "--device")
      devices = v;
    else if (k == "--qp-timeout")
      opts.qp_timeout = static_cast<std::uint8_t>(std::atoi(v.c_str()));
    else if (k == "--unreachable-gid")
      unreachable_gid = v;
    else if (k == "--port")
      opts.port = std::atoi(v.c_str());
    else if (k == "--gid")
      opts.gid_index = std::atoi(v.c_str());
    else if (k == "--bytes")
      bytes = std::stoull(v);
    else if (k == "--timeout-ms")
      timeout = std::chrono::milliseconds(std::atol(v.c_str()));
    else {
      std::fprintf(stderr, "verbs_write_check: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  {
    // Rank r takes the r-th name of a comma-separated list (the last one when it is shorter).
    std::size_t start = 0;
    for (int r = 0; r < rank; ++r) {
      const std::size_t comma = devices.find(',', start);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    opts.device = devices.substr(start, devices.find(',', start) - start);
  }
  nlohmann::json out{{"rank", rank},
                     {"world", world},
                     {"device", opts.device},
                     {"port", opts.port},
                     {"gid_index", opts.gid_index},
                     {"bytes", bytes}};
  if (dir.empty() || rank < 0 || world < 1 || rank >= world || opts.device.empty() ||
      bytes < 4096) {
    out["error"] = "usage: --dir D --rank R --world N --device DEV [--bytes >= 4096]";
    return report(out, 2);
  }
  auto fail = [&](const std::string& stage, const Error& e) {
    out["stage"] = stage;
    out["error"] = e.message;
    return report(out, e.exit_code == 2 ? 2 : 1);
  };

  auto store = make_directory_store(dir, rank, world);
  if (!store) return fail("store", store.error());
  auto transport = open_verbs_transport(rank, opts);
  if (!transport) return fail("open", transport.error());
  out["transport"] = (*transport)->description();
  if (!unreachable_gid.empty()) {
    in6_addr gid{};
    if (world != 1 || inet_pton(AF_INET6, unreachable_gid.c_str(), &gid) != 1) {
      out["error"] = "--unreachable-gid needs --world 1 and an IPv6 address (::ffff:a.b.c.d)";
      return report(out, 2);
    }
    auto blob = (*transport)->local_blob(0);
    if (!blob) return fail("connect", blob.error());
    auto info = parse_qp_info(*blob, 0, "own qp");
    if (!info) return fail("connect", info.error());
    std::memcpy(info->gid.data(), gid.s6_addr, 16);
    if (auto st = (*transport)->connect(0, serialize(*info)); !st)
      return fail("connect", st.error());
    std::vector<unsigned char> buffer(4096, 1);
    auto mem = (*transport)->register_memory(buffer.data(), buffer.size(), MemoryKind::host);
    if (!mem) return fail("register", mem.error());
    // More writes than the send queue holds: the error must come from write() itself (a full
    // queue waiting for completions) or from flush(), never a hang.
    const auto t0 = Clock::now();
    Status st = ok_status();
    for (int i = 0; i < 200 && st; ++i)
      st = (*transport)->write(0, *mem, 0, describe(*mem), 0, buffer.size());
    if (st) st = (*transport)->flush(0, timeout);
    out["failed_after_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (st) {
      out["error"] = "a write to an unreachable GID was acknowledged";
      return report(out, 1);
    }
    return fail("write", st.error());
  }

  // The source is our memory registered (register_memory), the target memory the transport
  // allocates (allocate_memory, what preflight uses): both paths carry the writes.
  std::vector<unsigned char> source(bytes);
  for (std::size_t i = 0; i < bytes; ++i) source[i] = pattern(rank, i);
  auto src = (*transport)->register_memory(source.data(), bytes, MemoryKind::host);
  if (!src) return fail("register", src.error());
  auto dst = (*transport)->allocate_memory(bytes);
  if (!dst) return fail("allocate", dst.error());
  auto* target = static_cast<unsigned char*>(dst->address);
  std::memset(target, 0, bytes);

  const int right = (rank + 1) % world;
  const int left = (rank + world - 1) % world;
  const std::string mem_key = fmt::format("vwc/mem/{}", rank);
  if (auto st = (*store)->put(mem_key,
                              encode_blob(BlobKind::memory_key, rank, serialize(describe(*dst))));
      !st)
    return fail("publish", st.error());
  const auto t_connect = Clock::now();
  std::vector<int> peers{right};
  if (left != right) peers.push_back(left);
  if (auto st = connect_peers(**transport, **store, peers, "vwc", timeout); !st)
    return fail("connect", st.error());
  out["connect_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - t_connect).count();
  const std::string right_key = fmt::format("vwc/mem/{}", right);
  auto raw = (*store)->get_string(right_key, timeout);
  if (!raw) return fail("peer key", raw.error());
  auto payload = decode_blob(*raw, BlobKind::memory_key, right, right_key);
  if (!payload) return fail("peer key", payload.error());
  auto remote = parse_remote_memory(*payload, right, right_key);
  if (!remote) return fail("peer key", remote.error());

  // Large pieces over the first half, then a run of small writes at odd offsets and lengths
  // (1 B, 3 B, 7 B, ... up to a few KiB) that together cover the second half exactly.
  const auto t_write = Clock::now();
  std::size_t writes = 0;
  const std::size_t half = bytes / 2;
  const std::size_t piece = std::size_t{1} << 20;
  Status st = ok_status();
  for (std::size_t off = 0; off < half && st; off += piece, ++writes)
    st = (*transport)->write(right, *src, off, *remote, off, std::min(piece, half - off));
  static const std::size_t small[] = {1, 3, 7, 64, 511, 4093, 8, 100003};
  for (std::size_t off = half, k = 0; off < bytes && st; ++k, ++writes) {
    const std::size_t n = std::min(small[k % std::size(small)], bytes - off);
    st = (*transport)->write(right, *src, off, *remote, off, n);
    off += n;
  }
  if (st) st = (*transport)->flush(right, timeout);
  if (!st) return fail("write", st.error());
  const double write_s = std::chrono::duration<double>(Clock::now() - t_write).count();
  out["writes"] = writes;
  out["write_seconds"] = write_s;
  out["write_mbytes_per_s"] = static_cast<double>(bytes) / write_s / 1e6;

  // Every rank's writes are complete at its target once its flush returned; the fence says
  // that all of them did.
  if (auto f = (*store)->fence(timeout); !f) return fail("fence", f.error());
  std::size_t mismatches = 0;
  long long first = -1;
  for (std::size_t i = 0; i < bytes; ++i)
    if (target[i] != pattern(left, i)) {
      if (first < 0) first = static_cast<long long>(i);
      ++mismatches;
    }
  out["verified_from_rank"] = left;
  out["mismatches"] = mismatches;
  out["first_mismatch"] = first;
  if (first >= 0)
    out["error"] = fmt::format("{} of {} bytes written by rank {} differ, first at offset {}",
                               mismatches, bytes, left, first);
  // Keep our QPs and memory alive until every rank has verified (a peer may still be reading
  // its completions).
  if (auto f = (*store)->fence(timeout); !f) return fail("final fence", f.error());
  return report(out, mismatches == 0 ? 0 : 1);
}
