// The worker's communicators of host memory (the CPU backend's Communicator, communicator.hpp):
// a TCP ring over loopback/Ethernet (ours) and the RDMA module's UCX ring all-reduce, and the
// choice between them.
#pragma once

#include <memory>
#include <string>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/communicator.hpp"

namespace topolaunch::kernels {

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

// The communicator of the worker with `rank` of `world_size` (the worker reads both from its
// environment, jobspec::worker_place): one rank alone needs none; else
// TOPOLAUNCH_KERNELS_COMM=ucx|tcp decides, else UCX when the launcher's store is there
// (TOPOLAUNCH_STORE_ADDR) and this build has UCX, else the TCP ring below.
Result<std::unique_ptr<Communicator>> communicator_for_worker(int rank, int world_size);

// The TCP ring on ports MASTER_PORT+1+rank of MASTER_ADDR (default 127.0.0.1); a single-rank
// communicator when the world size is 1.
Result<std::unique_ptr<Communicator>> tcp_ring_from_env(int rank, int world_size);

}  // namespace topolaunch::kernels
