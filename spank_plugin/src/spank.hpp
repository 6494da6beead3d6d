// The one place that includes Slurm's spank.h, and the plugin's per-process state.
#pragma once

#include <cstdint>  // spank.h uses uint32_t without including it

extern "C" {
// spank.h declares slurm_spank_* outside its own extern "C": included plainly, they would get
// C++ linkage and clash with our definitions (spank.md 1.1, C++ gotcha 1).
#include <slurm/spank.h>
}

#include <optional>
#include <string>

#include "node_plan.hpp"
#include "site_config.hpp"
#include "topolaunch/topology/mapping_spec.hpp"

namespace topolaunch::spank {

// Option values as the user gave them (validated on arrival).
struct UserOptions {
  std::optional<Mode> mode;
  std::optional<std::string> config_path;
  std::optional<topology::MappingPolicy> policy;
  std::optional<std::string> nics_text;
};

// SPANK calls plain C functions with no user pointer, so the plugin keeps one state object per
// process (srun, sbatch, or one slurmstepd per step and node), as pyxis does. It holds no
// resources; it dies with the process.
struct PluginState {
  bool site_ok = false;
  SiteConfig site;
  UserOptions options;
  // Errors found where Slurm 22.05 ignores them (remote option callbacks, user_init) are kept
  // here and raised in task_init, where a -1 fails the task (spank.md 1.3).
  std::string deferred_error;
  bool active = false;  // this step is mapped
  Mode mode = Mode::off;
  std::optional<NodePlan> plan;
};

PluginState& state();

// Registers the options (all contexts; the only way they reach sbatch/salloc).
int register_options(spank_t sp);

// Per-context bodies; each returns 0 or -1 and never throws (plugin.cpp catches anyway).
int local_init_post_opt(spank_t sp);
int remote_user_init(spank_t sp, int ac, char** av);
int remote_task_init(spank_t sp);

// slurm_error with our prefix; one line.
void log_error(const std::string& message);
void log_info(const std::string& message);   // unless log_level=error
void log_debug(const std::string& message);  // only with log_level=debug

}  // namespace topolaunch::spank
