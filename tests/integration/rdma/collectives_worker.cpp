// One rank of the host-collectives integration tests (driven by run_ranks.py):
//   exchange   broadcast a rank-specific byte pattern from every root, verify every byte
//   allreduce  fp32 and bf16 sums of integer-valued data for the given sizes, compared with the
//              sum computed locally (exact: integers are exact in both formats at these sizes)
//   survive    barriers until one fails (a peer was killed); prints the error and the time
//   busbw      timed fp32 all-reduces per size (--reps, after a warm-up), last one verified
// Prints "ready" after the communicator is up and "transports <lanes>"; exit 0 = verified,
// 1 = wrong data, 3 = a peer failed, 2 = bad arguments.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "topolaunch/rdma/collectives.hpp"
#include "topolaunch/rdma/store.hpp"

using namespace topolaunch;
using namespace topolaunch::rdma;

namespace {

std::vector<std::size_t> parse_sizes(const std::string& text) {
  std::vector<std::size_t> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    out.push_back(std::stoull(text.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

int fail(const std::string& what, int code) {
  std::printf("error: %s\n", what.c_str());
  std::fflush(stdout);
  return code;
}

int run_exchange(HostCommunicator& comm) {
  const std::size_t bytes = (std::size_t{4} << 20) + 13;  // not a multiple of the chunk size
  std::vector<unsigned char> buf(bytes);
  for (int root = 0; root < comm.world_size(); ++root) {
    auto pattern = [&](std::size_t i) {
      return static_cast<unsigned char>((i * 131 + static_cast<std::size_t>(root) * 7 + (i >> 12)) &
                                        0xff);
    };
    for (std::size_t i = 0; i < bytes; ++i) buf[i] = comm.rank() == root ? pattern(i) : 0;
    if (auto st = comm.broadcast(buf.data(), bytes, root); !st) return fail(st.error().message, 3);
    for (std::size_t i = 0; i < bytes; ++i)
      if (buf[i] != pattern(i))
        return fail("broadcast from root " + std::to_string(root) + ": byte " + std::to_string(i) +
                        " differs",
                    1);
  }
  std::printf("verified broadcast %zu bytes from %d roots\n", bytes, comm.world_size());
  return 0;
}

int run_allreduce(HostCommunicator& comm, const std::vector<std::size_t>& sizes) {
  const int n = comm.world_size();
  const float rank_weight = static_cast<float>(comm.rank() + 1);
  const float weight_sum = static_cast<float>(n * (n + 1) / 2);
  for (std::size_t count : sizes) {
    std::vector<float> data(count);
    for (std::size_t i = 0; i < count; ++i)
      data[i] = rank_weight * static_cast<float>(int(i % 7) - 3);
    auto t0 = std::chrono::steady_clock::now();
    if (auto st = comm.allreduce_sum(data.data(), count); !st) return fail(st.error().message, 3);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t i = 0; i < count; ++i) {
      const float expected = weight_sum * static_cast<float>(int(i % 7) - 3);
      if (data[i] != expected)
        return fail("fp32 all-reduce of " + std::to_string(count) + " elements: element " +
                        std::to_string(i) + " is " + std::to_string(data[i]) + ", expected " +
                        std::to_string(expected),
                    1);
    }
    std::vector<std::uint16_t> half(count);
    for (std::size_t i = 0; i < count; ++i)
      half[i] = float_to_bf16(rank_weight * static_cast<float>(int(i % 5) - 2));
    if (auto st = comm.allreduce_sum_bf16(half.data(), count); !st)
      return fail(st.error().message, 3);
    for (std::size_t i = 0; i < count; ++i) {
      const float expected = weight_sum * static_cast<float>(int(i % 5) - 2);
      if (bf16_to_float(half[i]) != expected)
        return fail("bf16 all-reduce of " + std::to_string(count) + " elements: element " +
                        std::to_string(i) + " is " + std::to_string(bf16_to_float(half[i])) +
                        ", expected " + std::to_string(expected),
                    1);
    }
    // Reduce-scatter: this rank's segment holds the sum; all-gather: every segment is its rank's.
    const std::size_t r = static_cast<std::size_t>(comm.rank()), w = static_cast<std::size_t>(n);
    const std::size_t s0 = count * r / w, s1 = count * (r + 1) / w;
    for (std::size_t i = 0; i < count; ++i)
      data[i] = rank_weight * static_cast<float>(int(i % 7) - 3);
    if (auto st = comm.reduce_scatter_sum(data.data(), count); !st)
      return fail(st.error().message, 3);
    for (std::size_t i = s0; i < s1; ++i)
      if (data[i] != weight_sum * static_cast<float>(int(i % 7) - 3))
        return fail("reduce-scatter of " + std::to_string(count) + " elements: element " +
                        std::to_string(i) + " of rank " + std::to_string(r) + "'s segment is wrong",
                    1);
    std::vector<double> owned(count, -1.0);
    for (std::size_t i = s0; i < s1; ++i) owned[i] = static_cast<double>(r) + 0.5;
    if (auto st = comm.allgather(owned.data(), count, sizeof(double)); !st)
      return fail(st.error().message, 3);
    for (std::size_t q = 0; q < w; ++q)
      for (std::size_t i = count * q / w; i < count * (q + 1) / w; ++i)
        if (owned[i] != static_cast<double>(q) + 0.5)
          return fail("all-gather of " + std::to_string(count) + " doubles: element " +
                          std::to_string(i) + " is not rank " + std::to_string(q) + "'s",
                      1);
    std::printf("verified allreduce count=%zu fp32_seconds=%.6f\n", count, secs);
  }
  return 0;
}

// For the benchmark: per size, one untimed warm-up and `reps` timed fp32 all-reduces (each on
// fresh rank-weighted data, initialised outside the timing), the last one verified.
int run_busbw(HostCommunicator& comm, const std::vector<std::size_t>& sizes, int reps) {
  const int n = comm.world_size();
  const float rank_weight = static_cast<float>(comm.rank() + 1);
  const float weight_sum = static_cast<float>(n * (n + 1) / 2);
  for (std::size_t count : sizes) {
    std::vector<float> data(count);
    std::string times;
    for (int rep = 0; rep <= reps; ++rep) {
      for (std::size_t i = 0; i < count; ++i)
        data[i] = rank_weight * static_cast<float>(int(i % 7) - 3);
      if (auto st = comm.barrier(); !st) return fail(st.error().message, 3);
      auto t0 = std::chrono::steady_clock::now();
      if (auto st = comm.allreduce_sum(data.data(), count); !st) return fail(st.error().message, 3);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) times += (times.empty() ? "" : ",") + std::to_string(secs);
    }
    for (std::size_t i = 0; i < count; ++i)
      if (data[i] != weight_sum * static_cast<float>(int(i % 7) - 3))
        return fail("fp32 all-reduce of " + std::to_string(count) + " elements: element " +
                        std::to_string(i) + " is wrong",
                    1);
    std::printf("busbw count=%zu bytes=%zu seconds=%s\n", count, count * sizeof(float),
                times.c_str());
    std::fflush(stdout);
  }
  return 0;
}

int run_survive(HostCommunicator& comm) {
  while (true) {
    if (auto st = comm.barrier(); !st) {
      auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                     .count();
      std::printf("detected at %.6f: %s\n", now, st.error().message.c_str());
      std::fflush(stdout);
      return 3;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, tls, mode = "exchange", sizes_text = "1";
  int rank = -1, world = 0;
  long chunk = 0;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir")
      dir = v;
    else if (k == "--rank")
      rank = std::atoi(v.c_str());
    else if (k == "--world")
      world = std::atoi(v.c_str());
    else if (k == "--tls")
      tls = v;
    else if (k == "--mode")
      mode = v;
    else if (k == "--sizes")
      sizes_text = v;
    else if (k == "--chunk")
      chunk = std::atol(v.c_str());
    else if (k == "--reps")
      reps = std::atoi(v.c_str());
    else
      return fail("unknown option " + k, 2);
  }
  auto store = make_directory_store(dir, rank, world);
  if (!store) return fail(store.error().message, 2);
  CommunicatorOptions options;
  options.transports = tls;
  options.timeout = std::chrono::milliseconds(30000);
  if (chunk > 0) options.chunk_bytes = static_cast<std::size_t>(chunk);
  auto comm = HostCommunicator::create(**store, options);
  if (!comm) return fail(comm.error().message, comm.error().exit_code);
  std::printf("ready rank %d\ntransports %s\n", rank, comm->transport_summary().c_str());
  std::fflush(stdout);
  int rc = 2;
  if (mode == "exchange")
    rc = run_exchange(*comm);
  else if (mode == "allreduce")
    rc = run_allreduce(*comm, parse_sizes(sizes_text));
  else if (mode == "busbw")
    rc = run_busbw(*comm, parse_sizes(sizes_text), reps);
  else if (mode == "survive")
    rc = run_survive(*comm);
  else
    return fail("unknown mode " + mode, 2);
  if (rc == 0) {
    if (auto st = comm->barrier(); !st) return fail(st.error().message, 3);
    std::printf("ok\n");
  }
  std::fflush(stdout);
  return rc;
}
