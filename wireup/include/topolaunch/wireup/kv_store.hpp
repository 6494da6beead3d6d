// The wireup KV store: how agents and workers exchange small blobs (node topologies, NCCL unique
// ids, UCX worker addresses, verbs QP blobs) before any fast transport exists.
//
// One interface, three backends:
//   pmix  under `srun --mpi=pmix` (PMIx_Put/Commit/Fence/Get, PMIX_GLOBAL scope)
//   pmi2  under `srun --mpi=pmi2` (PMI2_KVS_Put/Fence/Get; binary values are encoded and split)
//   tcp   our own store (tcp_store.hpp), hosted by node 0's agent or a test
//
// The contract every backend keeps (the PMI model):
//   - put() stages a value under a key; keys are job-global strings, so callers make them unique
//     per rank themselves (see rank_key()).
//   - commit() pushes staged puts out of the process; fence() is a barrier over all size() ranks
//     that also commits. A value put by rank A is guaranteed visible to rank B only after A
//     committed and both then took part in the same fence. (The TCP store happens to make
//     committed values visible at once, and its get() waits for them; do not rely on that if the
//     code must also run under PMIx/PMI2.)
//   - get() blocks until the key exists or the timeout passes; values are binary-safe.
//   - allgather() is the exchange most callers want (every rank's value of one round): a
//     collective over all size() ranks that each backend does its own bulk way (TCP: one round
//     trip, through the relay tree when there is one; PMIx: one collecting fence, then reads
//     from the local copy; PMI2: the fence Slurm runs as a tree of slurmstepd, then reads from
//     the node's slurmstepd).
//   - Every call that can wait takes a timeout; a dead peer makes fence() fail with an error that
//     names the ranks that did not arrive (TCP) instead of hanging.
//   - An object is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/env.hpp"
#include "topolaunch/common/result.hpp"

namespace topolaunch::wireup {

using Bytes = std::vector<std::byte>;
using std::chrono::milliseconds;

// Every rank's value of one allgather round, in rank order, in one buffer with a table of
// offsets: gathered[r] is a view of rank r's value, valid while the Gathered lives. One buffer
// instead of a vector per value: those cost every rank W small allocations, 67 M in all at 8,192
// ranks, where the allgather took a median 6.1 s with them and 3.8 s without
// (docs/wireup-cost-model.md).
class Gathered {
 public:
  Gathered() = default;
  // Takes `buffer` with the values back to back; value r is [offsets[r], offsets[r + 1]).
  // offsets has size() + 1 entries, starts at 0, does not decrease and ends at buffer.size().
  Gathered(Bytes buffer, std::vector<std::size_t> offsets)
      : buffer_(std::move(buffer)), offsets_(std::move(offsets)) {}

  std::size_t size() const { return offsets_.empty() ? 0 : offsets_.size() - 1; }  // 0 if moved
  bool empty() const { return size() == 0; }
  std::span<const std::byte> operator[](std::size_t rank) const {
    return std::span(buffer_).subspan(offsets_[rank], offsets_[rank + 1] - offsets_[rank]);
  }
  // For backends that read the values one at a time (PMIx, PMI2, the default allgather).
  void push_back(std::span<const std::byte> value) {
    if (offsets_.empty()) offsets_.push_back(0);
    buffer_.insert(buffer_.end(), value.begin(), value.end());
    offsets_.push_back(buffer_.size());
  }
  void reserve(std::size_t values, std::size_t bytes) {
    offsets_.reserve(values + 1);
    buffer_.reserve(bytes);
  }

 private:
  Bytes buffer_;
  std::vector<std::size_t> offsets_{0};
};

// "name/rank": the conventional key for a per-rank value (e.g. rank_key("topo", 3) == "topo/3").
inline std::string rank_key(std::string_view name, int rank) {
  return std::string(name) + "/" + std::to_string(rank);
}

class KvStore {
 public:
  virtual ~KvStore() = default;

  virtual int rank() const = 0;                  // 0 .. size()-1
  virtual int size() const = 0;                  // participants of fence()
  virtual std::string_view backend() const = 0;  // "tcp", "pmix" or "pmi2"

  virtual Status put(std::string_view key, std::span<const std::byte> value) = 0;
  virtual Status commit() = 0;
  virtual Status fence(milliseconds timeout) = 0;
  virtual Result<Bytes> get(std::string_view key, milliseconds timeout) = 0;
  // Several keys at once (e.g. every rank's value after a fence), in the order asked, waiting
  // until all exist or the timeout passes. The TCP store answers in one round trip; the
  // default asks one key at a time.
  virtual Result<std::vector<Bytes>> get_many(const std::vector<std::string>& keys,
                                              milliseconds timeout) {
    std::vector<Bytes> values;
    values.reserve(keys.size());
    for (const auto& key : keys) {
      auto value = get(key, timeout);
      if (!value) return value.error();
      values.push_back(std::move(*value));
    }
    return values;
  }

  // Every rank's value of the exchange `name`, indexed by rank, this rank's own included: put
  // rank_key(name, rank()), fence, read every rank's. A collective: all size() ranks call it with
  // the same name, once per round (a new round takes a new name). Afterwards get(rank_key(name,
  // r)) also finds rank r's value. The default is exactly put + fence + get_many.
  virtual Result<Gathered> allgather(std::string_view name, std::span<const std::byte> mine,
                                     milliseconds timeout) {
    if (auto s = put(rank_key(name, rank()), mine); !s) return s.error();
    if (auto s = fence(timeout); !s) return s.error();
    std::vector<std::string> keys;
    keys.reserve(static_cast<std::size_t>(size()));
    for (int r = 0; r < size(); ++r) keys.push_back(rank_key(name, r));
    auto values = get_many(keys, timeout);
    if (!values) return values.error();
    std::size_t bytes = 0;
    for (const auto& value : *values) bytes += value.size();
    Gathered gathered;
    gathered.reserve(values->size(), bytes);
    for (const auto& value : *values) gathered.push_back(value);
    return gathered;
  }

  // Conveniences over the virtuals above.
  Status put(std::string_view key, std::string_view text) {
    return put(key, std::as_bytes(std::span(text.data(), text.size())));
  }
  Result<std::string> get_string(std::string_view key, milliseconds timeout) {
    auto value = get(key, timeout);
    if (!value) return value.error();
    return std::string(reinterpret_cast<const char*>(value->data()), value->size());
  }
};

// Which backend connect_from_env() picks, in this order:
//   1. TOPOLAUNCH_WIREUP=tcp|pmix|pmi2 forces one (anything else is an error).
//   2. TOPOLAUNCH_STORE_ADDR=host:port -> tcp, with TOPOLAUNCH_STORE_SECRET and the rank/size from
//      TOPOLAUNCH_RANK/TOPOLAUNCH_WORLD_SIZE, else RANK/WORLD_SIZE. Checked before PMIx/PMI2 on
//      purpose: workers started by an agent that runs under srun inherit the agent's PMIX_* and
//      PMI_* variables, which describe the agent, not the worker.
//   3. PMIX_RANK + PMIX_NAMESPACE -> pmix.
//   4. PMI_FD or PMI_RANK -> pmi2.
// A backend that was not compiled in is an error that says so (never a silent fallback).
enum class Backend { tcp, pmix, pmi2 };
Result<Backend> choose_backend(const Environment& env);

// Connects (TCP: retries until connect_timeout, so workers may start before the server is up).
// `env` is usually this process's: current_environment() (common/env.hpp).
Result<std::unique_ptr<KvStore>> connect_from_env(
    const Environment& env, milliseconds connect_timeout = milliseconds(30000));

// Backends compiled into this build, e.g. {"tcp", "pmix", "pmi2"}.
std::vector<std::string> compiled_backends();

}  // namespace topolaunch::wireup
