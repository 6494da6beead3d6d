// nccl_communicator_from_env: the NCCL communicator of a worker started by the launcher, wired up
// through the store named by the environment (see worker_env.cpp for what the launcher sets).
// Kept apart from nccl_communicator.cpp so that the core needs only the KvStore interface.
#include "cuda_device.hpp"
#include "nccl_communicator.hpp"
#include "topolaunch/common/env.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"

namespace topolaunch::kernels::cuda {

Result<std::unique_ptr<NcclCommunicator>> nccl_communicator_from_env(NcclOptions base) {
  namespace env_name = jobspec::env;
  const Environment env = current_environment();
  if (auto run_id = env_value(env, env_name::kRunId)) base.run_id = *run_id;
  auto attempt = env_int(env, env_name::kAttempt, base.attempt);
  if (!attempt) return attempt.error();
  base.attempt = *attempt;
  // The device: the caller's when it names one; else the node-local rank modulo the GPUs this
  // process sees (the launcher isolates each rank with CUDA_VISIBLE_DEVICES, so its only visible
  // GPU is device 0 whatever the local rank is); else the current device.
  if (base.device < 0) {
    auto local = env_int(env, env_name::kLocalRank, -1);
    if (!local) return local.error();
    auto local_rank = env_int(env, env_name::kTopolaunchLocalRank, *local);
    if (!local_rank) return local_rank.error();
    if (*local_rank >= 0) {
      int visible = 0;
      if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
      auto device = cuda_device_for_local_rank(*local_rank, visible);
      if (!device) return make_error("nccl: " + device.error().message, device.error().exit_code);
      base.device = *device;
    }
  }
  auto store = wireup::connect_from_env(env, base.timeout);
  if (!store)
    return make_error("nccl: connecting to the wireup store: " + store.error().message, 1);
  return NcclCommunicator::create(**store, base);
}

}  // namespace topolaunch::kernels::cuda
