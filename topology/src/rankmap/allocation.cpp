// Reading the job's allocation on one node from Slurm's environment (pure), and the thin shell
// that reads this process's environment and /proc/self/status.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include "topolaunch/topology/rankmap.hpp"

namespace topolaunch::topology {

namespace {

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto end = text.find(separator, start);
    out.emplace_back(
        text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

// "0,1,4" or Slurm's range form "0-3,6". nullopt when an item is not an index.
std::optional<std::vector<int>> parse_indexes(std::string_view text) {
  auto set = CpuSet::parse_list(text);
  if (!set || set->empty()) return std::nullopt;
  // CpuSet sorts; keep Slurm's order is irrelevant: GPUs are used in bus order anyway.
  return set->ids();
}

const std::string* find(const Environment& env, const char* key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

}  // namespace

Result<NodeAllocation> allocation_from_env(const Environment& env,
                                           std::string_view cpus_allowed_list) {
  NodeAllocation alloc;
  const char* slurm_key = "SLURM_STEP_GPUS";
  const std::string* slurm = find(env, slurm_key);
  if (slurm == nullptr) {
    slurm_key = "SLURM_JOB_GPUS";
    slurm = find(env, slurm_key);
  }
  const std::string* cvd = find(env, "CUDA_VISIBLE_DEVICES");
  std::optional<std::vector<int>> slurm_ids;
  if (slurm != nullptr) {
    slurm_ids = parse_indexes(*slurm);
    if (!slurm_ids) {
      return make_error(fmt::format("{}=\"{}\": not a list of GPU indexes (e.g. 0,1,4 or 0-3)",
                                    slurm_key, *slurm));
    }
  }
  if (cvd != nullptr && (cvd->rfind("GPU-", 0) == 0 || cvd->rfind("MIG-", 0) == 0)) {
    for (const std::string& id : split(*cvd, ',')) {
      if (id.rfind("MIG-", 0) == 0) {
        return make_error(fmt::format(
            "CUDA_VISIBLE_DEVICES=\"{}\": MIG instances are not supported by the rank map "
            "(map whole GPUs)",
            *cvd));
      }
      if (id.rfind("GPU-", 0) != 0) {
        return make_error(
            fmt::format("CUDA_VISIBLE_DEVICES=\"{}\": mixes UUIDs and indexes", *cvd));
      }
      alloc.gpu_uuids.push_back(id);
    }
    alloc.all_gpus = false;
    alloc.cuda_naming = CudaNaming::uuid;
  } else if (cvd != nullptr) {
    auto cvd_ids = parse_indexes(*cvd);
    if (!cvd_ids) {
      return make_error(fmt::format(
          "CUDA_VISIBLE_DEVICES=\"{}\": not a list of GPU indexes or GPU- UUIDs", *cvd));
    }
    alloc.all_gpus = false;
    if (slurm_ids) {
      if (slurm_ids->size() != cvd_ids->size()) {
        return make_error(
            fmt::format("CUDA_VISIBLE_DEVICES=\"{}\" and {}=\"{}\" name a different number of GPUs",
                        *cvd, slurm_key, *slurm));
      }
      // ConstrainDevices: the process sees only its GPUs, renumbered 0..n-1 (spank.md §4.2).
      alloc.gpus = *slurm_ids;
      alloc.cuda_naming =
          *slurm_ids == *cvd_ids ? CudaNaming::global_index : CudaNaming::visible_index;
    } else {
      alloc.gpus = *cvd_ids;
      alloc.cuda_naming = CudaNaming::global_index;
    }
  } else if (slurm_ids) {
    alloc.all_gpus = false;
    alloc.gpus = *slurm_ids;
  }
  if (!cpus_allowed_list.empty()) {
    std::string_view trimmed = cpus_allowed_list;
    while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' '))
      trimmed.remove_suffix(1);
    auto cpus = CpuSet::parse_list(trimmed);
    if (!cpus || cpus->empty()) {
      return make_error(
          fmt::format("allowed cpus \"{}\": not a cpu list (e.g. 0-55,112-167)", trimmed));
    }
    alloc.cpus = *cpus;
  }
  return alloc;
}

Result<NodeAllocation> allocation_of_this_process() {
  const Environment env = current_environment();
  std::ifstream status("/proc/self/status");
  std::string line, cpus;
  while (std::getline(status, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      cpus = line.substr(line.find(':') + 1);
      cpus.erase(0, cpus.find_first_not_of(" \t"));
    }
  }
  return allocation_from_env(env, cpus);
}

}  // namespace topolaunch::topology
