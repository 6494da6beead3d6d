// Which CUDA device a worker's rank takes: a pure function (no CUDA), unit-tested on hosts without
// a GPU (tests/unit/kernels/test_step_communication.cpp).
#pragma once

#include <string>

#include "topolaunch/common/result.hpp"

namespace topolaunch::kernels::cuda {

// The CUDA device of a worker with node-local rank `local_rank` that sees `visible_devices` GPUs.
// The launcher gives each rank its own CUDA_VISIBLE_DEVICES (one visible GPU: device 0 whatever
// the local rank); a worker started without it sees every GPU of the node and takes the local
// rank's. local_rank mod visible_devices covers both.
inline Result<int> cuda_device_for_local_rank(int local_rank, int visible_devices) {
  if (visible_devices <= 0)
    return make_error("no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver)", 1);
  if (local_rank < 0)
    return make_error("LOCAL_RANK=" + std::to_string(local_rank) + ": must be >= 0", 2);
  return local_rank % visible_devices;
}

}  // namespace topolaunch::kernels::cuda
