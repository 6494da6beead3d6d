// A wireup client process for the integration tests and the benchmark. Reads its store from the
// environment like any worker (connect_from_env).
//
//   wireup_peer exchange <value_bytes> <timeout_ms> [rounds]
//       fence; then per round: allgather "r<round>" (every rank's value, the backend's own bulk
//       way) and check every value; a last fence, so that no rank exits while others still time
//       a round. Prints {"rank":R,"exchange_us":[...]} (one figure per round: the exchange alone,
//       the check after it not counted, as MPI_Allgather's peer counts it).
//   wireup_peer exchange-kv <value_bytes> <timeout_ms> [rounds]
//       the same by hand: put "r<round>/<rank>", fence, get every other rank's value (get_many);
//       also prints "get_us" (the part after the fence).
//   wireup_peer shared <timeout_ms>
//       rank 0 puts one key that is not per-rank (shared_key, like an NCCL unique id), fence,
//       every rank gets and checks it. Prints {"rank":R,"shared":"ok"}.
//   wireup_peer hang
//       connect, take part in the first fence, print "ready", then sleep (to be killed).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "topolaunch/wireup/kv_store.hpp"

using namespace topolaunch::wireup;

namespace {

Bytes value_of(int rank, int round, std::size_t bytes) {
  Bytes value(bytes);
  for (std::size_t i = 0; i < bytes; ++i)
    value[i] = static_cast<std::byte>((rank * 131 + round * 7 + i) & 0xff);
  return value;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "wireup_peer: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return fail("usage: wireup_peer exchange <bytes> <timeout_ms> [rounds] | hang");
  std::string mode = argv[1];
  auto store = connect_from_env(topolaunch::current_environment());
  if (!store) return fail(store.error().message);
  KvStore& kv = **store;

  if (mode == "hang") {
    if (auto r = kv.fence(milliseconds(30000)); !r) return fail(r.error().message);
    std::printf("ready\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "shared" && argc >= 3) {
    milliseconds timeout(std::strtoll(argv[2], nullptr, 10));
    const Bytes id = value_of(12345, 0, 128);
    // Put by rank 0 but named after the last rank, like "ep/<me>/<peer>" keys: a backend must
    // not guess a key's owner from its name.
    const std::string shared_key = "job/unique-id/" + std::to_string(kv.size() - 1);
    if (kv.rank() == 0) {
      if (auto r = kv.put(shared_key, id); !r) return fail(r.error().message);
    }
    if (auto r = kv.fence(timeout); !r) return fail(r.error().message);
    auto got = kv.get(shared_key, timeout);
    if (!got) return fail(got.error().message);
    if (*got != id) return fail("wrong shared value");
    std::printf("{\"rank\":%d,\"backend\":\"%s\",\"shared\":\"ok\"}\n", kv.rank(),
                std::string(kv.backend()).c_str());
    return 0;
  }
  if ((mode != "exchange" && mode != "exchange-kv") || argc < 4) return fail("bad arguments");
  const bool by_hand = mode == "exchange-kv";
  std::size_t bytes = std::strtoull(argv[2], nullptr, 10);
  milliseconds timeout(std::strtoll(argv[3], nullptr, 10));
  int rounds = argc > 4 ? std::atoi(argv[4]) : 1;

  if (auto r = kv.fence(timeout); !r) return fail(r.error().message);  // everyone is connected
  std::string times, get_times;
  for (int round = 0; round < rounds; ++round) {
    auto name = "r" + std::to_string(round);
    auto start = std::chrono::steady_clock::now();
    auto fenced = start, done = start;
    if (!by_hand) {
      auto values = kv.allgather(name, value_of(kv.rank(), round, bytes), timeout);
      if (!values) return fail(values.error().message);
      done = std::chrono::steady_clock::now();  // the check below is not the exchange's time
      if (values->size() != static_cast<std::size_t>(kv.size()))
        return fail("allgather returned " + std::to_string(values->size()) + " values");
      for (int peer = 0; peer < kv.size(); ++peer) {
        if (!std::ranges::equal((*values)[peer], value_of(peer, round, bytes)))
          return fail("wrong value from rank " + std::to_string(peer));
      }
      fenced = std::chrono::steady_clock::now();
    } else {
      if (auto r = kv.put(rank_key(name, kv.rank()), value_of(kv.rank(), round, bytes)); !r) {
        return fail(r.error().message);
      }
      if (auto r = kv.fence(timeout); !r) return fail(r.error().message);
      fenced = std::chrono::steady_clock::now();
      std::vector<std::string> keys;
      std::vector<int> owners;
      for (int peer = 0; peer < kv.size(); ++peer) {
        if (peer == kv.rank()) continue;
        keys.push_back(rank_key(name, peer));
        owners.push_back(peer);
      }
      auto values = kv.get_many(keys, timeout);
      if (!values) return fail(values.error().message);
      done = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < owners.size(); ++i) {
        if ((*values)[i] != value_of(owners[i], round, bytes)) {
          return fail("wrong value from rank " + std::to_string(owners[i]));
        }
      }
    }
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(done - start);
    times += (round ? "," : "") + std::to_string(us.count());
    auto get_us = std::chrono::duration_cast<std::chrono::microseconds>(done - fenced);
    get_times += (round ? "," : "") + std::to_string(get_us.count());
  }
  // Every rank stays until all have done their rounds (as MPI_Finalize holds the MPI peer's):
  // a rank that exits early would take a core from the others' last round.
  if (auto r = kv.fence(timeout); !r) return fail(r.error().message);
  std::printf("{\"rank\":%d,\"size\":%d,\"backend\":\"%s\",\"exchange_us\":[%s]%s}\n", kv.rank(),
              kv.size(), std::string(kv.backend()).c_str(), times.c_str(),
              by_hand ? (",\"get_us\":[" + get_times + "]").c_str() : "");
  return 0;
}
