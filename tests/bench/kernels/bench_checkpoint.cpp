// Step-time cost of a checkpoint on the CPU backend, synchronous against asynchronous, in the same
// run: an MLP whose parameters + AdamW moments are >= 1 GiB (the checkpoint's payload), trained
// with a checkpoint every --every steps. The cost of one checkpoint is what a round of --every
// steps takes beyond --every plain steps (the median round), so whatever the background write
// takes from the step loop (cores, memory bandwidth, a submit that waits for the previous write)
// is counted. The files are written with fsync, as the worker writes them; the JSON names the
// filesystem and the disk under --dir. Also: CRC-64 throughput (the writer's and the verifier's
// checksum) against memcpy.
//
//   kernels_bench_checkpoint [--dir D] [--every N] [--rounds R] [--embd E]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/plan.hpp"

using namespace topolaunch::kernels;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

// "device fstype" of the mount holding path, and the block device's model when sysfs has one.
std::string describe_disk(const fs::path& path) {
  std::ifstream mounts("/proc/self/mounts");
  std::string device, point, type, best_device, best_type, best_point;
  std::string rest;
  const std::string target = fs::weakly_canonical(path).string();
  while (mounts >> device >> point >> type && std::getline(mounts, rest)) {
    const bool under = target == point || target.starts_with(point == "/" ? point : point + "/");
    if (under && point.size() >= best_point.size()) {
      best_device = device;
      best_type = type;
      best_point = point;
    }
  }
  std::string out = best_device + " " + best_type + " on " + best_point;
  const std::string block = fs::path(best_device).filename().string();
  const fs::path sys = fs::path("/sys/block") / block;
  if (!block.empty() && fs::exists(sys)) {
    const std::string model = read_line(sys / "device" / "model");
    const std::string vendor = read_line(sys / "device" / "vendor");
    const bool rotational = read_line(sys / "queue" / "rotational") == "1";
    out += std::string(", ") + (rotational ? "rotational" : "non-rotational");
    if (!model.empty()) out += ", model " + model;
    if (vendor == "0x1af4") out += ", virtio block device";  // Red Hat's PCI vendor id
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = fs::temp_directory_path() / "topolaunch-bench-checkpoint";
  int every = 10, rounds = 2;  // 10 steps: longer than one write here, so it can be hidden
  std::int64_t embd = 4608;    // 96.7 M parameters: 1.16 GB of parameters + m + v
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir")
      dir = argv[i + 1];
    else if (a == "--every")
      every = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--rounds")
      rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--embd")
      embd = std::max(64, std::atoi(argv[i + 1]));
  }
  fs::create_directories(dir);

  MlpConfig c;  // embedding 8192 x E, one hidden layer E x E, head E x 8192
  c.vocab_size = 8192;
  c.n_embd = embd;
  c.hidden = {embd};
  c.batch = 1;
  c.seq_len = 8;
  Graph g = build_mlp(c);
  append_backward(g);
  append_optimizer(g);
  auto plan = compile_plan(std::move(g), PlanOptions{});
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.error().message.c_str());
    return 1;
  }
  CpuExecutor<float> ex(*plan);
  ex.init_parameters(1);
  ex.set_loss_scale(1.0 / 8);
  std::uint64_t state_bytes = 0;
  for (const auto& e : checkpoint_layout(plan->graph)) state_bytes += e.bytes();
  if (state_bytes < (std::uint64_t{1} << 30))
    std::fprintf(stderr, "note: the checkpoint is %.2f GiB, under the 1 GiB this measures\n",
                 static_cast<double>(state_bytes) / (1u << 30));

  std::int64_t step = 0;
  auto train_step = [&] {
    std::int32_t* tok = ex.ints(plan->graph.tokens);
    std::int32_t* tgt = ex.ints(plan->graph.targets);
    for (int i = 0; i < 8; ++i) {
      tok[i] = static_cast<std::int32_t>((step * 8 + i) % c.vocab_size);
      tgt[i] = static_cast<std::int32_t>((step * 8 + i + 1) % c.vocab_size);
    }
    if (auto s = ex.run_forward_backward(nullptr); !s) {
      std::fprintf(stderr, "%s\n", s.error().message.c_str());
      std::exit(1);
    }
    if (auto s = ex.run_optimizer(AdamWSettings{}, ++step); !s) {
      std::fprintf(stderr, "%s\n", s.error().message.c_str());
      std::exit(1);
    }
  };
  for (int i = 0; i < 2; ++i) train_step();  // first touches of the arena

  std::vector<double> plain;
  for (int i = 0; i < 2 * every; ++i) {
    const auto t0 = Clock::now();
    train_step();
    plain.push_back(seconds_since(t0));
  }
  const double step_s = median(plain);

  // Rounds of `every` steps, a checkpoint submitted after the last; the async writer is flushed
  // only at the end (its last write not counted in a round, as in the worker where the next
  // round hides it).
  struct Measured {
    double round_s, cost_s, submit_s, flush_s;
  };
  auto measure = [&](bool asynchronous) {
    const fs::path sub = dir / (asynchronous ? "async" : "sync");
    fs::remove_all(sub);
    CheckpointWriter writer(sub.string(), 2, asynchronous);
    std::vector<double> round_times, submit_times;
    for (int r = 0; r < rounds + 1; ++r) {  // round 0: the writer's first buffer and file
      const auto t0 = Clock::now();
      for (int i = 0; i < every; ++i) train_step();
      const auto s0 = Clock::now();
      if (auto s = writer.submit(ex, {step, 0, 0}); !s) {
        std::fprintf(stderr, "%s\n", s.error().message.c_str());
        std::exit(1);
      }
      if (r > 0) {
        submit_times.push_back(seconds_since(s0));
        round_times.push_back(seconds_since(t0));
      }
    }
    const auto f0 = Clock::now();
    if (auto s = writer.flush(); !s) {
      std::fprintf(stderr, "%s\n", s.error().message.c_str());
      std::exit(1);
    }
    const double flush_s = seconds_since(f0);
    fs::remove_all(sub);
    const double round_s = median(round_times);
    return Measured{round_s, round_s - every * step_s, median(submit_times), flush_s};
  };
  const Measured sync = measure(false);
  const Measured async = measure(true);
  const std::string disk = describe_disk(dir);
  for (const auto& [mode, m] : {std::pair{"sync", sync}, std::pair{"async", async}}) {
    std::printf(
        "{\"bench\":\"checkpoint_step_cost\",\"mode\":\"%s\",\"model\":\"mlp 8192x%lld\","
        "\"checkpoint_bytes\":%llu,\"checkpoint_every\":%d,\"rounds\":%d,\"step_ms\":%.1f,"
        "\"round_ms\":%.1f,\"cost_ms_per_checkpoint\":%.1f,\"submit_ms\":%.1f,"
        "\"final_flush_ms\":%.1f,\"peer\":\"sync\",\"peer_cost_ms\":%.1f,\"ratio\":%.3f,"
        "\"disk\":\"%s\"}\n",
        mode, static_cast<long long>(embd), static_cast<unsigned long long>(state_bytes), every,
        rounds, step_s * 1e3, m.round_s * 1e3, m.cost_s * 1e3, m.submit_s * 1e3, m.flush_s * 1e3,
        sync.cost_s * 1e3, sync.cost_s > 0 ? m.cost_s / sync.cost_s : 0.0, disk.c_str());
  }

  // CRC-64 against memcpy of the same bytes (both one core, in cache-sized pieces of 8 MiB).
  std::vector<std::byte> bytes(256u << 20, std::byte{1}), copy(8u << 20);
  std::uint64_t crc = 0;
  auto t0 = Clock::now();
  for (std::size_t at = 0; at < bytes.size(); at += copy.size())
    crc = crc64(std::span(bytes).subspan(at, copy.size()), crc);
  const double crc_s = seconds_since(t0);
  t0 = Clock::now();
  for (std::size_t at = 0; at < bytes.size(); at += copy.size())
    std::memcpy(copy.data(), bytes.data() + at, copy.size());
  const double copy_s = seconds_since(t0);
  const double gb = static_cast<double>(bytes.size()) / 1e9;
  std::printf(
      "{\"bench\":\"crc64_throughput\",\"gb_per_s\":%.2f,\"peer\":\"memcpy\",\"peer_gb_per_s\":%."
      "2f,"
      "\"ratio\":%.3f,\"crc\":\"%016llx\"}\n",
      gb / crc_s, gb / copy_s, copy_s / crc_s, static_cast<unsigned long long>(crc));
  return 0;
}
