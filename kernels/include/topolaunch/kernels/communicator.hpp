// Gradient communication between data-parallel ranks, behind a small interface so the trainer does
// not care how the sum is made: a single-rank no-op, a TCP ring over loopback/Ethernet (ours), and
// later the RDMA module's UCX ring all-reduce.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "topolaunch/common/result.hpp"

namespace topolaunch::kernels {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place sum over all ranks; every rank gets the identical result (same summation order).
  virtual Status all_reduce_sum(std::span<float> data) = 0;
  virtual Status all_reduce_sum(std::span<double> data) = 0;
  virtual Status barrier() = 0;
};

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Status all_reduce_sum(std::span<float>) override { return ok_status(); }
  Status all_reduce_sum(std::span<double>) override { return ok_status(); }
  Status barrier() override { return ok_status(); }
};

// Ranks connect in a ring over TCP: rank r listens on base_port + r and connects to its successor.
// Reduce-scatter + all-gather (2(n-1)/n of the data per rank). Chunks are reduced in a fixed
// order, so all ranks end bit-identical.
Result<std::unique_ptr<Communicator>> connect_tcp_ring(int rank, int world_size,
                                                       const std::string& host, int base_port,
                                                       int timeout_ms = 30000);

// UCX host collectives of the RDMA module, wired up through the launcher's KV store (the
// environment connect_from_env of wireup reads). Only in builds with UCX.
bool have_ucx_communicator();
Result<std::unique_ptr<Communicator>> connect_ucx_from_env();

// Chooses by TOPOLAUNCH_KERNELS_COMM=ucx|tcp, else UCX when the launcher's store is there
// (TOPOLAUNCH_STORE_ADDR) and this build has UCX, else the TCP ring below.
Result<std::unique_ptr<Communicator>> communicator_for_worker();

// From the torchrun-style environment the launcher sets (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT): a single-rank communicator when WORLD_SIZE is unset or 1, else the TCP ring on
// ports MASTER_PORT+1+rank.
Result<std::unique_ptr<Communicator>> communicator_from_env();

}  // namespace topolaunch::kernels
