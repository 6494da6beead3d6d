// nccl_communicator_from_env: the NCCL communicator of a worker started by the launcher, wired up
// through the store named by the environment (see worker_env.cpp for what the launcher sets).
// Kept apart from nccl_communicator.cpp so that the core needs only the KvStore interface.
#include <charconv>

#include "cuda_worker_parts.hpp"
#include "nccl_communicator.hpp"

namespace topolaunch::kernels::cuda {

namespace {

Result<int> int_var(const wireup::Env& env, const char* name, int fallback) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return fallback;
  int value = 0;
  const char* end = it->second.data() + it->second.size();
  auto [ptr, ec] = std::from_chars(it->second.data(), end, value);
  if (ec != std::errc() || ptr != end || value < 0)
    return make_error(std::string(name) + "=" + it->second + ": not a non-negative integer", 2);
  return value;
}

}  // namespace

Result<std::unique_ptr<NcclCommunicator>> nccl_communicator_from_env(NcclOptions base) {
  const wireup::Env env = wireup::current_environment();
  if (auto it = env.find("TOPOLAUNCH_RUN_ID"); it != env.end() && !it->second.empty())
    base.run_id = it->second;
  auto attempt = int_var(env, "TOPOLAUNCH_ATTEMPT", base.attempt);
  if (!attempt) return attempt.error();
  base.attempt = *attempt;
  // The device: the caller's when it names one; else the node-local rank modulo the GPUs this
  // process sees (the launcher isolates each rank with CUDA_VISIBLE_DEVICES, so its only visible
  // GPU is device 0 whatever the local rank is); else the current device.
  if (base.device < 0) {
    auto local = int_var(env, "LOCAL_RANK", -1);
    if (!local) return local.error();
    auto local_rank = int_var(env, "TOPOLAUNCH_LOCAL_RANK", *local);
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
