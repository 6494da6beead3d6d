// One rank of a preflight run on this host (integration tests, benchmarks, the QEMU suite):
// prints the JSON lines; exit status = the preflight's (0 pass, 4 unhealthy fabric, 2 bad input).
//   --dir D --rank R --world N [--transport ucx|verbs] [--tls T] [--device D --port P --gid G]
//   [--level quick|full] [--sysfs ROOT] [--message BYTES] [--total BYTES] [--buffer BYTES]
//   [--iters N] [--min-gbps X] [--max-lat-us X] [--node NAME] [--timeout-ms T]
//   [--corrupt-put KEY_PART]  (tests: flip one byte of every value put under a key containing it)
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "topolaunch/rdma/preflight.hpp"
#include "topolaunch/rdma/store.hpp"

using namespace topolaunch;
using namespace topolaunch::rdma;

namespace {

// A store that damages what this rank publishes under some keys, as a broken store or a
// mismatched peer would: the other ranks must fail with an error naming the key and this rank.
class CorruptingStore final : public wireup::KvStore {
 public:
  CorruptingStore(std::unique_ptr<wireup::KvStore> inner, std::string key_part)
      : inner_(std::move(inner)), key_part_(std::move(key_part)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  Status put(std::string_view key, std::span<const std::byte> value) override {
    if (key.find(key_part_) == std::string_view::npos || value.empty())
      return inner_->put(key, value);
    std::vector<std::byte> damaged(value.begin(), value.end());
    damaged[damaged.size() / 2] ^= std::byte{0x5a};
    return inner_->put(key, damaged);
  }
  Status commit() override { return inner_->commit(); }
  Status fence(std::chrono::milliseconds timeout) override { return inner_->fence(timeout); }
  Result<wireup::Bytes> get(std::string_view key, std::chrono::milliseconds timeout) override {
    return inner_->get(key, timeout);
  }
  Result<std::vector<wireup::Bytes>> get_many(const std::vector<std::string>& keys,
                                              std::chrono::milliseconds timeout) override {
    return inner_->get_many(keys, timeout);
  }

 private:
  std::unique_ptr<wireup::KvStore> inner_;
  std::string key_part_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir, level = "full", sysfs = "/sys", corrupt_put;
  int rank = -1, world = 0;
  PreflightConfig c;
  c.node = "localhost";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir")
      dir = v;
    else if (k == "--rank")
      rank = std::atoi(v.c_str());
    else if (k == "--world")
      world = std::atoi(v.c_str());
    else if (k == "--transport")
      c.transport = v;
    else if (k == "--tls")
      c.ucx.transports = v;
    else if (k == "--device")
      c.verbs.device = v;
    else if (k == "--port")
      c.verbs.port = std::atoi(v.c_str());
    else if (k == "--gid")
      c.verbs.gid_index = std::atoi(v.c_str());
    else if (k == "--level")
      level = v;
    else if (k == "--sysfs")
      sysfs = v;
    else if (k == "--message")
      c.message_bytes = std::stoull(v);
    else if (k == "--total")
      c.bandwidth_total_bytes = std::stoull(v);
    else if (k == "--buffer")
      c.buffer_bytes = std::stoull(v);
    else if (k == "--iters")
      c.latency_iterations = std::atoi(v.c_str());
    else if (k == "--min-gbps")
      c.min_gbytes_per_s = std::atof(v.c_str());
    else if (k == "--max-lat-us")
      c.max_latency_us = std::atof(v.c_str());
    else if (k == "--node")
      c.node = v;
    else if (k == "--corrupt-put")
      corrupt_put = v;
    else if (k == "--timeout-ms") {
      const std::chrono::milliseconds t(std::atol(v.c_str()));
      c.local_timeout = c.connectivity_timeout = c.bandwidth_timeout = c.latency_timeout = t;
    } else {
      std::fprintf(stderr, "preflight_worker: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  auto lvl = parse_preflight_level(level);
  if (!lvl) {
    std::fprintf(stderr, "%s\n", lvl.error().message.c_str());
    return 2;
  }
  c.level = *lvl;
  auto devices = probe_rdma_devices(sysfs);
  if (!devices) {
    std::fprintf(stderr, "%s\n", devices.error().message.c_str());
    return 2;
  }
  c.devices = *devices;
  auto store = make_directory_store(dir, rank, world);
  if (!store) {
    std::fprintf(stderr, "%s\n", store.error().message.c_str());
    return 2;
  }
  std::unique_ptr<wireup::KvStore> kv = std::move(*store);
  if (!corrupt_put.empty()) kv = std::make_unique<CorruptingStore>(std::move(kv), corrupt_put);
  auto report = run_preflight(*kv, c, &std::cout);
  if (!report) {
    std::fprintf(stderr, "%s\n", report.error().message.c_str());
    return report.error().exit_code;
  }
  return report->exit_status();
}
