// Two-rank test of the NCCL communicator (kernels/cuda/nccl_communicator.*) on a 2-GPU host.
// Plain main (exit status = failed scenarios) so that it builds on the GPU host, which has another
// Catch2 than CI. Started without arguments it is the launcher: it hosts our TCP store and starts
// the ranks as processes of this executable with the launcher's worker environment
// (tests/gpu/nccl_ranks.hpp), every scenario under a wall-clock deadline.
//
// Scenarios:
//   sum               2 ranks: all-reduce of 1 element .. 256 MiB (fp32) and up to 256 MiB (bf16)
//                     of integer-valued data equals the host sum bit for bit on both ranks; one
//                     all-reduce captured into a CUDA graph and replayed; per-call timings
//                     (bytes, events) and the exposed time after a compute event.
//   absent-peer       rank 1 never starts: rank 0 fails within its timeout, naming rank 1.
//   stalled-init      rank 1 passes the id exchange but never calls NCCL: rank 0's init fails
//                     within its timeout (non-blocking init + abort), nothing hangs.
//   stalled-collective rank 1 never calls the all-reduce: rank 0's synchronize() fails within its
//                     timeout and aborts the communicator.
//
//   test_nccl [scenario...]      (default: all four)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "nccl_communicator.hpp"
#include "nccl_ranks.hpp"

namespace gpu = topolaunch::kernels::cuda;
namespace t = topolaunch::testing;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, cudaGetErrorString(e));
    std::exit(100);
  }
}

milliseconds timeout_from_env(const char* name, int fallback_ms) {
  const char* v = std::getenv(name);
  return milliseconds(v != nullptr ? std::atoi(v) : fallback_ms);
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(std::size_t n) {
    check_cuda(cudaMalloc(&ptr, n * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Integer-valued data, different per rank: sums of two are exact in fp32 (|v| <= 2048) and in
// bf16 (|v| <= 100, sums <= 200 < 256).
float value_f32(std::size_t i, int rank) {
  return static_cast<float>(
      static_cast<int>((i * 2654435761ull + static_cast<std::size_t>(rank) * 97u) % 4096u) - 2048);
}
float value_bf16(std::size_t i, int rank) {
  return static_cast<float>(
      static_cast<int>((i * 31u + static_cast<std::size_t>(rank) * 7u) % 201u) - 100);
}

std::unique_ptr<gpu::NcclCommunicator> make_comm(milliseconds timeout) {
  gpu::NcclOptions options;
  options.name = "test";
  options.timeout = timeout;
  auto comm = gpu::nccl_communicator_from_env(options);
  if (!comm) {
    std::fprintf(stderr, "FATAL %s\n", comm.error().message.c_str());
    std::exit(100);
  }
  return std::move(*comm);
}

// --- worker: sum -------------------------------------------------------------------------------

void check_fp32(gpu::NcclCommunicator& comm, cudaStream_t stream, std::size_t count) {
  const int world = comm.world_size();
  std::vector<float> host(count), expected(count, 0.0f), back(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = value_f32(i, comm.rank());
  for (int r = 0; r < world; ++r)
    for (std::size_t i = 0; i < count; ++i) expected[i] += value_f32(i, r);
  DeviceBuffer<float> d(count);
  check_cuda(cudaMemcpy(d.ptr, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), "h2d");
  comm.clear_timings();
  cudaError_t e = comm.all_reduce_sum(d.ptr, count, stream);
  auto s = comm.synchronize(stream, milliseconds(60000));
  check_cuda(cudaMemcpy(back.data(), d.ptr, count * sizeof(float), cudaMemcpyDeviceToHost), "d2h");
  std::size_t first_bad = count;
  for (std::size_t i = 0; i < count && first_bad == count; ++i)
    if (std::memcmp(&back[i], &expected[i], sizeof(float)) != 0) first_bad = i;
  std::string what = "fp32 all-reduce of " + std::to_string(count) + " elements (" +
                     std::to_string(count * 4) + " bytes) equals the host sum bit for bit";
  if (e != cudaSuccess) what += " [enqueue: " + comm.last_error() + "]";
  if (!s) what += " [sync: " + s.error().message + "]";
  if (first_bad != count)
    what += " [element " + std::to_string(first_bad) + ": " + std::to_string(back[first_bad]) +
            " != " + std::to_string(expected[first_bad]) + "]";
  check(e == cudaSuccess && s.ok() && first_bad == count, what);
  auto timings = comm.timings();
  check(timings.ok() && timings->size() == 1 && (*timings)[0].bytes == count * 4 &&
            (*timings)[0].ms > 0.0f,
        "  its timing record: 1 call of " + std::to_string(count * 4) + " bytes, " +
            (timings.ok() && !timings->empty() ? std::to_string((*timings)[0].ms) : "?") + " ms");
}

void check_bf16(gpu::NcclCommunicator& comm, cudaStream_t stream, std::size_t count) {
  const int world = comm.world_size();
  std::vector<__nv_bfloat16> host(count), back(count), expected(count);
  for (std::size_t i = 0; i < count; ++i) {
    host[i] = __float2bfloat16(value_bf16(i, comm.rank()));
    float sum = 0;
    for (int r = 0; r < world; ++r) sum += value_bf16(i, r);
    expected[i] = __float2bfloat16(sum);
  }
  DeviceBuffer<__nv_bfloat16> d(count);
  check_cuda(cudaMemcpy(d.ptr, host.data(), count * 2, cudaMemcpyHostToDevice), "h2d");
  cudaError_t e = comm.all_reduce_sum(d.ptr, count, stream);
  auto s = comm.synchronize(stream, milliseconds(60000));
  check_cuda(cudaMemcpy(back.data(), d.ptr, count * 2, cudaMemcpyDeviceToHost), "d2h");
  std::size_t first_bad = count;
  for (std::size_t i = 0; i < count && first_bad == count; ++i)
    if (std::memcmp(&back[i], &expected[i], 2) != 0) first_bad = i;
  std::string what = "bf16 all-reduce of " + std::to_string(count) + " elements (" +
                     std::to_string(count * 2) + " bytes) equals the host sum bit for bit";
  if (e != cudaSuccess) what += " [enqueue: " + comm.last_error() + "]";
  if (!s) what += " [sync: " + s.error().message + "]";
  if (first_bad != count)
    what += " [element " + std::to_string(first_bad) + ": " +
            std::to_string(__bfloat162float(back[first_bad])) +
            " != " + std::to_string(__bfloat162float(expected[first_bad])) + "]";
  check(e == cudaSuccess && s.ok() && first_bad == count, what);
}

// One all-reduce captured into a graph and replayed 3 times: the data doubles after the first
// sum (both ranks hold the same sum), so it ends at 4 * sum; each replay re-records the timing
// events.
void check_graph(gpu::NcclCommunicator& comm, cudaStream_t stream) {
  const std::size_t count = (std::size_t{1} << 22) + 5;  // 16 MiB + 20 bytes
  std::vector<float> host(count), back(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = value_f32(i, comm.rank());
  DeviceBuffer<float> d(count);
  check_cuda(cudaMemcpy(d.ptr, host.data(), count * 4, cudaMemcpyHostToDevice), "h2d");
  comm.clear_timings();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  cudaError_t e = comm.all_reduce_sum(d.ptr, count, stream);
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  check(e == cudaSuccess, "all-reduce captured into a CUDA graph" +
                              (e == cudaSuccess ? std::string() : " [" + comm.last_error() + "]"));
  if (e != cudaSuccess) return;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  bool timed_each = true;
  for (int replay = 0; replay < 3; ++replay) {
    check_cuda(cudaGraphLaunch(exec, stream), "graph launch");
    auto s = comm.synchronize(stream, milliseconds(60000));
    if (!s) check(false, "graph replay: " + s.error().message);
    auto timings = comm.timings();
    timed_each = timed_each && timings.ok() && timings->size() == 1 &&
                 (*timings)[0].bytes == count * 4 && (*timings)[0].ms > 0.0f;
  }
  check_cuda(cudaMemcpy(back.data(), d.ptr, count * 4, cudaMemcpyDeviceToHost), "d2h");
  std::size_t first_bad = count;
  for (std::size_t i = 0; i < count && first_bad == count; ++i) {
    float sum = 0;
    for (int r = 0; r < comm.world_size(); ++r) sum += value_f32(i, r);
    // Replay 1 sums the inputs; each later replay multiplies by the world size.
    const float expected = sum * static_cast<float>(comm.world_size() * comm.world_size());
    if (back[i] != expected) first_bad = i;
  }
  check(first_bad == count,
        "3 graph replays of the captured all-reduce give world^2 x the sum" +
            (first_bad == count ? std::string() : " [element " + std::to_string(first_bad) + "]"));
  check(timed_each, "each replay re-records the call's timing events (1 call, its bytes, ms > 0)");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// exposed_after(): communication issued after the compute event is all exposed (> 0 and not more
// than the call itself plus slack); a compute event recorded after the all-reduce hides it (0).
void check_exposed(gpu::NcclCommunicator& comm, cudaStream_t stream) {
  const std::size_t count = std::size_t{1} << 24;  // 64 MiB
  DeviceBuffer<float> d(count);
  check_cuda(cudaMemset(d.ptr, 0, count * 4), "memset");
  cudaEvent_t before = nullptr, after = nullptr;
  check_cuda(cudaEventCreate(&before), "event");
  check_cuda(cudaEventCreate(&after), "event");
  comm.clear_timings();
  check_cuda(cudaEventRecord(before, stream), "record");
  cudaError_t e = comm.all_reduce_sum(d.ptr, count, stream);
  check_cuda(cudaEventRecord(after, stream), "record");
  auto s = comm.synchronize(stream, milliseconds(60000));
  auto timings = comm.timings();
  auto exposed_all = comm.exposed_after(before);
  auto exposed_none = comm.exposed_after(after);
  const float call_ms = timings.ok() && !timings->empty() ? (*timings)[0].ms : -1.0f;
  check(e == cudaSuccess && s.ok() && exposed_all.ok() && *exposed_all > 0.0f &&
            *exposed_all <= call_ms + 0.05f,
        "exposed_after(event before the call) = " +
            (exposed_all.ok() ? std::to_string(*exposed_all) : exposed_all.error().message) +
            " ms, within (0, call " + std::to_string(call_ms) + " ms]");
  check(exposed_none.ok() && *exposed_none == 0.0f,
        "exposed_after(event after the call) = 0 (" +
            (exposed_none.ok() ? std::to_string(*exposed_none) : exposed_none.error().message) +
            ")");
  cudaEventDestroy(before);
  cudaEventDestroy(after);
}

int worker_sum() {
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  const int world = std::atoi(std::getenv("TOPOLAUNCH_WORLD_SIZE"));
  if (devices < world) {
    std::fprintf(stderr, "FATAL this test needs %d GPUs, this process sees %d\n", world, devices);
    return 100;
  }
  auto comm = make_comm(timeout_from_env("TEST_NCCL_TIMEOUT_MS", 60000));
  std::printf("rank %d of %d on device %d, nccl %s\n", comm->rank(), comm->world_size(),
              comm->device(), gpu::NcclCommunicator::nccl_version().c_str());
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  for (std::size_t count :
       {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{17}, std::size_t{1000},
        std::size_t{4099}, std::size_t{65541}, std::size_t{1} << 20, (std::size_t{1} << 22) + 3,
        std::size_t{1} << 24, std::size_t{1} << 26 /* 256 MiB */})
    check_fp32(*comm, stream, count);
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4099},
                            (std::size_t{1} << 20) + 1, std::size_t{1} << 27 /* 256 MiB */})
    check_bf16(*comm, stream, count);
  check_graph(*comm, stream);
  check_exposed(*comm, stream);
  comm.reset();  // finalize + destroy while the stream still exists
  cudaStreamDestroy(stream);
  return g_failures;
}

// --- workers: failure paths ----------------------------------------------------------------------

// Expects create() to fail within timeout + slack with a message that contains `needle`.
int expect_create_failure(const char* needle) {
  const milliseconds timeout = timeout_from_env("TEST_NCCL_TIMEOUT_MS", 3000);
  const auto start = Clock::now();
  gpu::NcclOptions options;
  options.name = "test";
  options.timeout = timeout;
  auto comm = gpu::nccl_communicator_from_env(options);
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  if (comm) {
    check(false, "create() succeeded although the peer never joined");
    return g_failures;
  }
  std::printf("error after %lld ms: %s\n", static_cast<long long>(took.count()),
              comm.error().message.c_str());
  check(comm.error().message.find(needle) != std::string::npos,
        std::string("the error says '") + needle + "'");
  check(took < timeout * 3 + milliseconds(10000),
        "it came within the timeout (" + std::to_string(took.count()) + " ms, timeout " +
            std::to_string(timeout.count()) + " ms)");
  return g_failures;
}

// Rank 1 of stalled-init: joins the store's fence (so rank 0 gets past the id exchange) and then
// never calls NCCL; the launcher kills it.
int worker_stall_after_fence() {
  auto store = topolaunch::wireup::connect_from_env(topolaunch::current_environment());
  if (!store) {
    std::fprintf(stderr, "FATAL %s\n", store.error().message.c_str());
    return 100;
  }
  if (auto s = (*store)->fence(milliseconds(60000)); !s) {
    std::fprintf(stderr, "FATAL fence: %s\n", s.error().message.c_str());
    return 100;
  }
  std::printf("rank 1 passed the fence and now stalls\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::minutes(10));
  return 0;
}

// stalled-collective: both ranks make the communicator; rank 1 then stalls without calling the
// all-reduce, rank 0 expects synchronize() to time out and abort.
int worker_stalled_collective() {
  auto comm = make_comm(milliseconds(60000));
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  // One all-reduce that both take part in: the channels are connected, so what follows is a
  // stall of the peer, not a connection failure.
  DeviceBuffer<float> d(std::size_t{1} << 20);
  check_cuda(cudaMemset(d.ptr, 0, (std::size_t{1} << 20) * 4), "memset");
  cudaError_t e = comm->all_reduce_sum(d.ptr, std::size_t{1} << 20, stream);
  auto s = comm->synchronize(stream, milliseconds(60000));
  check(e == cudaSuccess && s.ok(), "the first all-reduce completes on both ranks");
  if (comm->rank() == 1) {
    std::printf("rank 1 now stalls without calling the all-reduce\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::minutes(10));
    return 0;
  }
  const milliseconds timeout = timeout_from_env("TEST_NCCL_TIMEOUT_MS", 3000);
  const auto start = Clock::now();
  e = comm->all_reduce_sum(d.ptr, std::size_t{1} << 20, stream);
  s = comm->synchronize(stream, timeout);
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  std::printf("after %lld ms: %s\n", static_cast<long long>(took.count()),
              s ? "completed" : s.error().message.c_str());
  check(e == cudaSuccess && !s.ok() &&
            s.error().message.find("did not complete within") != std::string::npos,
        "synchronize() reports the stalled all-reduce");
  check(took < timeout + milliseconds(10000),
        "within the timeout (" + std::to_string(took.count()) + " ms)");
  check(comm->all_reduce_sum(d.ptr, 1, stream) != cudaSuccess,
        "the aborted communicator refuses further calls: " + comm->last_error());
  const auto destroy_start = Clock::now();
  comm.reset();
  const auto destroy_ms =
      std::chrono::duration_cast<milliseconds>(Clock::now() - destroy_start).count();
  check(destroy_ms < 30000, "the destructor returns (" + std::to_string(destroy_ms) + " ms)");
  // The abort ended the stalled all-reduce's kernel, so the stream drains (were it still spinning,
  // this would block and the launcher's deadline would report the hang).
  const cudaError_t drained = cudaStreamSynchronize(stream);
  check(drained == cudaSuccess,
        std::string("the stream drains after the abort: ") + cudaGetErrorString(drained));
  return g_failures;
}

// --- launcher ------------------------------------------------------------------------------------

struct Scenario {
  std::string name;
  int world_size = 2;
  std::vector<int> start_ranks;            // ranks started (the others never join)
  std::vector<int> must_pass;              // ranks that must exit 0
  std::vector<int> expected_stalled;       // ranks killed by the launcher once the others finish
  std::map<std::string, std::string> env;  // extra environment
  int deadline_s = 120;
};

int run_scenario(const std::string& self, const Scenario& sc, const std::string& log_dir) {
  const std::string secret = t::random_secret();
  auto store = t::start_store(sc.world_size, secret);
  std::vector<t::RankProcess> ranks;
  const auto start = Clock::now();
  for (int r : sc.start_ranks) {
    std::vector<std::string> args{"--worker", sc.name};
    ranks.push_back(t::spawn_rank(self, args, r, sc.world_size, store->address(), secret,
                                  "test-nccl-" + sc.name + "-" + std::to_string(::getpid()), sc.env,
                                  log_dir + "/" + sc.name + ".rank" + std::to_string(r) + ".log"));
  }
  // Wait for the ranks that must finish; the stalled ones are killed afterwards.
  std::vector<t::RankProcess> finishing, stalled;
  for (auto& p : ranks) {
    bool is_stalled = false;
    for (int r : sc.expected_stalled) is_stalled = is_stalled || r == p.rank;
    (is_stalled ? stalled : finishing).push_back(p);
  }
  t::wait_ranks(finishing, start + std::chrono::seconds(sc.deadline_s));
  for (auto& p : stalled) t::kill_rank(p);
  const double took_s = std::chrono::duration<double>(Clock::now() - start).count();
  int failures = 0;
  for (const auto& p : finishing) {
    std::string log = t::read_file(p.log_path);
    std::printf("--- %s rank %d (%s)\n%s", sc.name.c_str(), p.rank, p.log_path.c_str(),
                log.c_str());
    const bool passed = !p.timed_out && p.signal == 0 && p.exit_code == 0;
    if (!passed) {
      ++failures;
      std::printf("FAIL %s rank %d: %s\n", sc.name.c_str(), p.rank,
                  p.timed_out ? ("still running after " + std::to_string(sc.deadline_s) +
                                 " s: killed (a hang)")
                                    .c_str()
                  : p.signal ? ("killed by signal " + std::to_string(p.signal)).c_str()
                             : ("exit status " + std::to_string(p.exit_code)).c_str());
    }
  }
  for (const auto& p : stalled)
    std::printf("--- %s rank %d (stalled on purpose, killed)\n%s", sc.name.c_str(), p.rank,
                t::read_file(p.log_path).c_str());
  std::printf("%s scenario %s (%.1f s)\n\n", failures == 0 ? "PASS" : "FAIL", sc.name.c_str(),
              took_s);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--worker") {
    const std::string scenario = argv[2];
    const int rank = std::atoi(std::getenv("TOPOLAUNCH_RANK"));
    if (scenario == "sum" || scenario == "sum-1") return worker_sum();
    if (scenario == "absent-peer") return expect_create_failure("missing ranks: 1");
    if (scenario == "stalled-init")
      return rank == 0 ? expect_create_failure("did not complete within")
                       : worker_stall_after_fence();
    if (scenario == "stalled-collective") return worker_stalled_collective();
    std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  std::vector<Scenario> all = {
      // one rank on one GPU: the communicator, its all-reduce and graph capture on any GPU host
      {"sum-1", 1, {0}, {0}, {}, {}, 60},
      {"sum", 2, {0, 1}, {0, 1}, {}, {}, 120},
      {"absent-peer", 2, {0}, {0}, {}, {{"TEST_NCCL_TIMEOUT_MS", "3000"}}, 30},
      {"stalled-init", 2, {0, 1}, {0}, {1}, {{"TEST_NCCL_TIMEOUT_MS", "5000"}}, 40},
      {"stalled-collective", 2, {0, 1}, {0}, {1}, {{"TEST_NCCL_TIMEOUT_MS", "3000"}}, 60},
  };
  std::vector<std::string> wanted(argv + 1, argv + argc);
  const char* log_env = std::getenv("TEST_NCCL_LOG_DIR");
  std::string log_dir = log_env != nullptr ? log_env : "/tmp";
  const std::string self = t::self_path();
  int failed = 0, ran = 0;
  for (const auto& sc : all) {
    bool selected = wanted.empty();
    for (const auto& w : wanted) selected = selected || w == sc.name;
    if (!selected) continue;
    ++ran;
    failed += run_scenario(self, sc, log_dir);
  }
  if (ran == 0) {
    std::fprintf(stderr,
                 "no such scenario (sum-1, sum, absent-peer, stalled-init, stalled-collective)\n");
    return 2;
  }
  std::printf("test_nccl: %d of %d scenarios passed\n", ran - failed, ran);
  return failed;
}
