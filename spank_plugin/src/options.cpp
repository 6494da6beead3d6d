// The user options. Registered with spank_option_register in every context (local, allocator,
// remote), so `srun`, `sbatch`, `salloc` and `#SBATCH` lines all accept them. Slurm 22.05 calls
// each callback twice in slurmstepd (launch message and environment, spank.md 1.4): callbacks
// only store the validated value, so a second call is harmless.
#include <fmt/format.h>

#include "spank.hpp"
#include "text_checks.hpp"

namespace topolaunch::spank {
namespace {

enum OptionId { kMode = 1, kConfig, kMap, kNics };

// Locally a -1 makes srun print "Invalid --x argument" and exit; remotely Slurm only logs it,
// so the reason is also deferred to task_init.
int reject(int remote, const std::string& message) {
  log_error(message);
  if (remote && state().deferred_error.empty()) state().deferred_error = message;
  return -1;
}

int on_option(int val, const char* optarg, int remote) {
  try {
    const std::string_view value = optarg ? optarg : "";
    auto& options = state().options;
    switch (val) {
      case kMode: {
        auto mode = parse_mode(value);
        if (!mode) return reject(remote, mode.error().message);
        options.mode = *mode;
        return 0;
      }
      case kConfig: {
        if (auto ok = check_path(value, "--topolaunch-config"); !ok) {
          return reject(remote, ok.error().message);
        }
        options.config_path = std::string(value);
        return 0;
      }
      case kMap: {
        auto policy = parse_policy(value);
        if (!policy) return reject(remote, policy.error().message);
        options.policy = *policy;
        return 0;
      }
      case kNics: {
        auto nics = parse_nic_list(value, "--topolaunch-nics");
        if (!nics) return reject(remote, nics.error().message);
        options.nics_text = std::string(value);
        return 0;
      }
      default:
        return reject(remote, fmt::format("unknown option id {}", val));
    }
  } catch (const std::exception& e) {
    return reject(remote, fmt::format("option: {}", e.what()));
  } catch (...) {
    return reject(remote, "option: unexpected error");
  }
}

// spank_option wants char*, not const char*.
char kModeName[] = "topolaunch";
char kModeArg[] = "auto|off|verbose";
char kModeUsage[] =
    "[topolaunch] bind each task to its GPU, cores, NUMA memory and NIC by the node topology "
    "and export RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR, CUDA_VISIBLE_DEVICES, NCCL_IB_HCA, "
    "UCX_NET_DEVICES (verbose: one line per task)";
char kConfigName[] = "topolaunch-config";
char kConfigArg[] = "FILE";
char kConfigUsage[] = "[topolaunch] job config (TOML) whose [mapping] table drives the map";
char kMapName[] = "topolaunch-map";
char kMapArg[] = "auto|block|cyclic";
char kMapUsage[] = "[topolaunch] rank mapping policy (overrides the job config)";
char kNicsName[] = "topolaunch-nics";
char kNicsArg[] = "LIST";
char kNicsUsage[] =
    "[topolaunch] NICs ranks may use, NCCL_IB_HCA syntax (e.g. ^mlx5_1); within the site's";

}  // namespace

int register_options(spank_t sp) {
  // Static: Slurm may keep pointers into the table after registration.
  static struct spank_option table[] = {
      {kModeName, kModeArg, kModeUsage, 1, kMode, on_option},
      {kConfigName, kConfigArg, kConfigUsage, 1, kConfig, on_option},
      {kMapName, kMapArg, kMapUsage, 1, kMap, on_option},
      {kNicsName, kNicsArg, kNicsUsage, 1, kNics, on_option},
  };
  for (auto& option : table) {
    const spank_err_t rc = spank_option_register(sp, &option);
    if (rc != ESPANK_SUCCESS) {
      log_error(fmt::format("cannot register --{}: {}", option.name, spank_strerror(rc)));
      return -1;
    }
  }
  return 0;
}

}  // namespace topolaunch::spank
