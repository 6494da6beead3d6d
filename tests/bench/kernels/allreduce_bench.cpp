// All-reduce bus bandwidth through our path (NcclCommunicator: id through the wireup TCP store,
// ncclAllReduce on our stream) from 1 MiB to 1 GiB, fp32 sum, one rank per GPU on `--world` GPUs
// (default 2; GPUs 0..world-1). The peer figures come from allreduce_torch.py (torch.distributed,
// NCCL backend) in the same device run.
//
// Method (as nccl-tests): per size, 5 warm-up calls, then `iters` back-to-back calls between two
// CUDA events on the stream, 3 trials, the median trial reported; algbw = bytes / time,
// busbw = algbw * 2(n-1)/n (GB = 1e9 bytes). A second pass times 10 single calls with the
// communicator's own per-call events (what the executor reports per bucket) for comparison.
// Never a pass/fail on timing.
//
//   allreduce_bench [--world 2] [--out FILE] [--max-mib N] [--timeout-s 100]
//       (launcher: starts the ranks, prints rank 0's JSON; ranks still running after
//       --timeout-s are killed)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "nccl_communicator.hpp"
#include "nccl_ranks.hpp"

namespace gpu = topolaunch::kernels::cuda;
namespace t = topolaunch::testing;
using std::chrono::milliseconds;

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, cudaGetErrorString(e));
    std::exit(100);
  }
}

void check_call(gpu::NcclCommunicator& comm, cudaError_t e) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "FATAL %s\n", comm.last_error().c_str());
    std::exit(100);
  }
}

int worker(const std::string& out_path, std::size_t max_bytes) {
  gpu::NcclOptions options;
  options.name = "bench";
  auto made = gpu::nccl_communicator_from_env(options);
  if (!made) {
    std::fprintf(stderr, "FATAL %s\n", made.error().message.c_str());
    return 100;
  }
  auto& comm = **made;
  const int n = comm.world_size();
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  float* data = nullptr;
  check_cuda(cudaMalloc(&data, max_bytes), "cudaMalloc");
  check_cuda(cudaMemset(data, 0, max_bytes), "memset");  // zeros: sums stay finite
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "event");
  check_cuda(cudaEventCreate(&stop), "event");

  std::string rows;
  for (std::size_t bytes = std::size_t{1} << 20; bytes <= max_bytes; bytes *= 2) {
    const std::size_t count = bytes / sizeof(float);
    const int iters =
        static_cast<int>(std::clamp<std::size_t>((std::size_t{4} << 30) / bytes, 20, 200));
    comm.set_time_calls(false);
    for (int i = 0; i < 5; ++i) check_call(comm, comm.all_reduce_sum(data, count, stream));
    std::vector<float> trial_ms;
    for (int trial = 0; trial < 3; ++trial) {
      check_cuda(cudaEventRecord(start, stream), "record");
      for (int i = 0; i < iters; ++i) check_call(comm, comm.all_reduce_sum(data, count, stream));
      check_cuda(cudaEventRecord(stop, stream), "record");
      if (auto s = comm.synchronize(stream, milliseconds(120000)); !s) {
        std::fprintf(stderr, "FATAL %s\n", s.error().message.c_str());
        return 100;
      }
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start, stop), "elapsed");
      trial_ms.push_back(ms / static_cast<float>(iters));
    }
    std::sort(trial_ms.begin(), trial_ms.end());
    const double ms = trial_ms[1];
    // The communicator's own per-call events, as the executor reads them per bucket.
    comm.set_time_calls(true);
    comm.clear_timings();
    for (int i = 0; i < 10; ++i) check_call(comm, comm.all_reduce_sum(data, count, stream));
    auto timings = comm.timings();
    if (!timings) {
      std::fprintf(stderr, "FATAL %s\n", timings.error().message.c_str());
      return 100;
    }
    std::vector<float> call_ms;
    for (const auto& tm : *timings) call_ms.push_back(tm.ms);
    std::sort(call_ms.begin(), call_ms.end());
    const double algbw = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    char row[512];
    std::snprintf(row, sizeof row,
                  "%s\n    {\"bytes\": %zu, \"iters\": %d, \"ms\": %.5f, \"algbw_GBps\": %.2f, "
                  "\"busbw_GBps\": %.2f, \"per_call_event_ms_median\": %.5f}",
                  rows.empty() ? "" : ",", bytes, iters, ms, algbw, busbw,
                  call_ms[call_ms.size() / 2]);
    rows += row;
    if (comm.rank() == 0) {
      std::fprintf(stderr, "%10zu bytes  %8.4f ms  algbw %7.2f  busbw %7.2f GB/s\n", bytes, ms,
                   algbw, busbw);
    }
  }
  if (comm.rank() == 0) {
    int device = comm.device();
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device), "properties");
    std::FILE* out = std::fopen(out_path.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "FATAL cannot write %s\n", out_path.c_str());
      return 100;
    }
    std::fprintf(out,
                 "{\"benchmark\": \"allreduce\", \"system\": \"topolaunch NcclCommunicator\", "
                 "\"nccl_version\": \"%s\", \"device\": \"%s\", \"world_size\": %d, "
                 "\"dtype\": \"float32\", \"op\": \"sum\", \"results\": [%s\n]}\n",
                 gpu::NcclCommunicator::nccl_version().c_str(), prop.name, n, rows.c_str());
    std::fclose(out);
  }
  cudaFree(data);
  made->reset();
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "/dev/stdout";
  std::size_t max_mib = 1024;
  int world = 2, timeout_s = 100;
  bool is_worker = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--worker")
      is_worker = true;
    else if (a == "--out" && i + 1 < argc)
      out_path = argv[++i];
    else if (a == "--max-mib" && i + 1 < argc)
      max_mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--world" && i + 1 < argc)
      world = std::atoi(argv[++i]);
    else if (a == "--timeout-s" && i + 1 < argc)
      timeout_s = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: allreduce_bench [--world 2] [--out FILE] [--max-mib N] "
                   "[--timeout-s 100]\n");
      return 2;
    }
  }
  if (world < 1 || timeout_s < 1 || max_mib < 1) {
    std::fprintf(stderr,
                 "allreduce_bench: --world, --timeout-s and --max-mib must be at least 1\n");
    return 2;
  }
  const std::size_t max_bytes = max_mib << 20;
  if (is_worker) return worker(out_path, max_bytes);

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < world) {
    std::fprintf(stderr, "allreduce_bench needs %d GPUs, this process sees %d\n", world, devices);
    return 3;
  }
  const std::string secret = t::random_secret();
  auto store = t::start_store(world, secret);
  const std::string tmp = "/tmp/allreduce_bench." + std::to_string(::getpid());
  const std::string json_path = tmp + ".json";
  std::vector<t::RankProcess> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(t::spawn_rank(
        t::self_path(), {"--worker", "--out", json_path, "--max-mib", std::to_string(max_mib)}, r,
        world, store->address(), secret, "allreduce-bench-" + std::to_string(::getpid()), {},
        tmp + ".rank" + std::to_string(r) + ".log"));
  t::wait_ranks(ranks, std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s));
  int failed = 0;
  for (const auto& p : ranks) {
    std::fprintf(stderr, "%s", t::read_file(p.log_path).c_str());
    if (p.timed_out || p.signal != 0 || p.exit_code != 0) {
      std::fprintf(stderr, "rank %d: %s\n", p.rank,
                   p.timed_out ? "killed at --timeout-s" : "failed");
      ++failed;
    }
  }
  if (failed != 0) return 1;
  std::string json = t::read_file(json_path);
  if (out_path == "/dev/stdout") {
    std::fputs(json.c_str(), stdout);
  } else {
    std::FILE* out = std::fopen(out_path.c_str(), "w");
    if (out == nullptr) return 1;
    std::fputs(json.c_str(), out);
    std::fclose(out);
  }
  return 0;
}
