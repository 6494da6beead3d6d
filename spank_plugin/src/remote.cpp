// slurmstepd (S_CTX_REMOTE). user_init runs once per node per step with the user's effective
// ids: it gathers what Slurm says about the step, loads the topology and the job config and
// computes this node's part of the rank map. task_init runs in each task just before exec, as
// the user: it binds the task and exports its environment. Errors of user_init are kept and
// raised in task_init, the only place where Slurm 22.05 fails the task on -1 (spank.md 1.3).
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "slurm_text.hpp"
#include "spank.hpp"
#include "task_binding.hpp"
#include "text_checks.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topology_cache.hpp"
#include "user_file.hpp"

namespace topolaunch::spank {
namespace {

using topology::NodeTopology;

// Batch, extern and interactive steps (and the pending-step marker) are never mapped: their
// environment and affinity would leak into every step started inside them (spank.md 1.6).
constexpr std::uint32_t kFirstSpecialStep = 0xfffffffa;

Result<std::uint32_t> get_u32(spank_t sp, spank_item_t item, const char* what) {
  std::uint32_t value = 0;
  const spank_err_t rc = spank_get_item(sp, item, &value);
  if (rc != ESPANK_SUCCESS) {
    return make_error(fmt::format("slurm item {}: {}", what, spank_strerror(rc)), 1);
  }
  return value;
}

Environment job_environment(spank_t sp) {
  Environment env;
  char** entries = nullptr;
  if (spank_get_item(sp, S_JOB_ENV, &entries) != ESPANK_SUCCESS || entries == nullptr) return env;
  for (char** e = entries; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    env.emplace(std::string(*e, static_cast<std::size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

std::string env_or(const Environment& env, const char* name, const char* fallback = "") {
  auto it = env.find(name);
  return it == env.end() ? fallback : it->second;
}

Result<UserIdentity> user_identity(spank_t sp) {
  UserIdentity user;
  if (spank_get_item(sp, S_JOB_UID, &user.uid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_GID, &user.gid) != ESPANK_SUCCESS) {
    return make_error("slurm gave no job uid/gid", 1);
  }
  gid_t* gids = nullptr;
  int count = 0;
  if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &count) == ESPANK_SUCCESS && gids) {
    user.groups.assign(gids, gids + count);
  }
  return user;
}

Result<StepInfo> step_info(spank_t sp, std::uint32_t job_id, std::uint32_t step_id) {
  StepInfo step;
  step.job_id = job_id;
  step.step_id = step_id;
  auto node_id = get_u32(sp, S_JOB_NODEID, "S_JOB_NODEID");
  auto total = get_u32(sp, S_JOB_TOTAL_TASK_COUNT, "S_JOB_TOTAL_TASK_COUNT");
  auto local = get_u32(sp, S_JOB_LOCAL_TASK_COUNT, "S_JOB_LOCAL_TASK_COUNT");
  if (!node_id) return node_id.error();
  if (!total) return total.error();
  if (!local) return local.error();
  step.world_size = static_cast<int>(*total);
  step.local_tasks = static_cast<int>(*local);
  step.env = job_environment(sp);

  std::string nodelist = env_or(step.env, "SLURM_STEP_NODELIST");
  if (nodelist.empty()) nodelist = env_or(step.env, "SLURM_NODELIST");
  auto nodes = expand_hostlist(nodelist);
  if (!nodes) return make_error(fmt::format("SLURM_STEP_NODELIST: {}", nodes.error().message));
  step.step_nodes = *nodes;
  if (*node_id >= step.step_nodes.size()) {
    return make_error(
        fmt::format("node id {} is outside the step's {} nodes", *node_id, step.step_nodes.size()));
  }
  step.node_name = step.step_nodes[*node_id];

  const std::string per_node = env_or(step.env, "SLURM_STEP_TASKS_PER_NODE",
                                      env_or(step.env, "SLURM_TASKS_PER_NODE").c_str());
  auto counts = expand_tasks_per_node(per_node);
  if (!counts)
    return make_error(fmt::format("SLURM_STEP_TASKS_PER_NODE: {}", counts.error().message));
  step.tasks_per_node = *counts;

  char* cores = nullptr;
  if (spank_get_item(sp, S_STEP_ALLOC_CORES, &cores) == ESPANK_SUCCESS && cores && *cores) {
    auto set = topology::CpuSet::parse_list(cores);
    if (!set) return make_error(fmt::format("S_STEP_ALLOC_CORES '{}' is not a core list", cores));
    step.alloc_cores = *set;
  }
  return step;
}

// The nodes' topologies from the site's files: every node's with %n, this node's alone without.
// Through the node's cache (one stat and one small read per node, an import only for bytes new
// to this node); read directly when the cache is off or cannot be used.
Result<StepTopologies> site_topologies(const SiteConfig& site, const StepInfo& step) {
  const std::vector<std::string> nodes = site.topology_xml.find("%n") != std::string::npos
                                             ? step.step_nodes
                                             : std::vector<std::string>{step.node_name};
  if (!site.topology_cache.empty()) {
    auto cached = load_step_topologies(site, nodes, step.node_name);
    if (!cached) return cached.error();
    if (cached->unusable.empty()) {
      if (!cached->write_error.empty()) {
        log_info(
            fmt::format("{}: topology cache not updated: {}", step.node_name, cached->write_error));
      }
      log_debug(fmt::format("{}: topology cache {}: {} files unchanged, {} imported, {} distinct",
                            step.node_name, site.topology_cache, cached->from_cache,
                            cached->imported, cached->distinct));
      return cached;
    }
    log_info(fmt::format("{}: topology cache not used: {}", step.node_name, cached->unusable));
  }
  return load_step_topologies_direct(site, nodes, step.node_name);
}

// The effective [mapping]: job config (read as the user), then the command-line overrides,
// with the site's NIC filter always applied.
Result<topology::MappingSpec> mapping_spec(spank_t sp, const PluginState& s) {
  topology::MappingSpec spec;
  if (s.options.config_path) {
    if (!s.site.allow_user_config) {
      return make_error("--topolaunch-config: this site does not accept job configs");
    }
    auto user = user_identity(sp);
    if (!user) return user.error();
    auto text = read_file_as_user(*s.options.config_path, *user);
    if (!text) return make_error(fmt::format("--topolaunch-config={}", text.error().message));
    // Parsed first in a child with the user's identity and limits: a defect of the TOML
    // library must not take slurmstepd (root) down with it.
    IsolationLimits limits;
    limits.uid = user->uid;
    limits.gid = user->gid;
    limits.wall = std::chrono::seconds(5);
    auto config = jobspec::parse_job_config_isolated(*text, *s.options.config_path, limits);
    if (!config) return config.error();
    spec = config->mapping;
  }
  if (s.options.policy) spec.policy = *s.options.policy;
  if (s.options.nics_text) {
    auto nics = parse_nic_list(*s.options.nics_text, "--topolaunch-nics");
    if (!nics) return nics.error();
    spec.nics = *nics;
  }
  return spec;
}

Status plan_this_node(spank_t sp, PluginState& s, std::uint32_t job_id, std::uint32_t step_id) {
  const auto began = std::chrono::steady_clock::now();
  auto step = step_info(sp, job_id, step_id);
  if (!step) return step.error();
  auto spec = mapping_spec(sp, s);
  if (!spec) return spec.error();
  // This node's topology: live, or from the site's files with (given %n) every other node's.
  StepTopologies files;
  std::shared_ptr<const NodeTopology> mine;
  if (s.site.topology_xml.empty()) {
    topology::DiscoverOptions options;
    options.nics = s.site.nics;
    options.hostname = step->node_name;
    auto live = topology::discover_live(options);
    if (!live) return live.error();
    mine = std::make_shared<const NodeTopology>(std::move(*live));
  } else {
    auto loaded = site_topologies(s.site, *step);
    if (!loaded) return loaded.error();
    files = std::move(*loaded);
    auto own = files.by_node.find(step->node_name);
    if (own == files.by_node.end()) {
      return make_error(fmt::format("no topology for node {}", step->node_name));
    }
    mine = own->second;
  }
  // A NIC the user names that this node lacks would leave the ranks without it, silently.
  if (s.options.nics_text) {
    if (auto named = topology::check_named_nics(spec->nics, *mine, step->node_name,
                                                "--topolaunch-nics=" + *s.options.nics_text);
        !named)
      return named.error();
  }
  // Other nodes: their files' topologies; without per-node files this node's stands in for them
  // (a live node cannot see its peers from inside a SPANK hook).
  TopologyLoader others =
      [&](const std::string& node) -> Result<std::shared_ptr<const NodeTopology>> {
    auto it = files.by_node.find(node);
    return it != files.by_node.end() ? it->second : mine;
  };
  auto plan = plan_node(*step, mine, others, *spec);
  if (!plan) return plan.error();
  for (const auto& note : plan->notes) log_info(fmt::format("{}: {}", step->node_name, note));
  const auto took =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began);
  log_info(fmt::format("job {}.{} node {}: {} tasks mapped in {:.1f} ms, topology from {}", job_id,
                       step_id, step->node_name, plan->tasks.size(), took.count(),
                       mine->sources.origin));
  for (const auto& task : plan->tasks) {
    log_debug(fmt::format("task {} rank {}: cpus {} numa {}", task.local_task, task.rank.rank,
                          task.rank.cpus.to_list(), task.rank.numa));
  }
  s.plan = std::move(*plan);
  return ok_status();
}

void say(const std::string& line) {
  // The task's stderr is already the job's stderr here: srun shows it with the task label.
  const std::string text = "topolaunch: " + line + "\n";
  (void)!write(STDERR_FILENO, text.data(), text.size());
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

}  // namespace

int remote_user_init(spank_t sp, int, char**) {
  if (spank_remote(sp) != 1) return 0;
  auto& s = state();
  auto job_id = get_u32(sp, S_JOB_ID, "S_JOB_ID");
  auto step_id = get_u32(sp, S_JOB_STEPID, "S_JOB_STEPID");
  if (!job_id || !step_id) {
    s.deferred_error = !job_id ? job_id.error().message : step_id.error().message;
    return 0;
  }
  if (*step_id >= kFirstSpecialStep) return 0;
  s.mode = s.options.mode.value_or(s.site.default_mode);
  if (!s.deferred_error.empty() || !s.site_ok) {
    s.active = true;  // raise it in task_init
    return 0;
  }
  if (s.mode == Mode::off) return 0;
  s.active = true;
  if (auto ok = plan_this_node(sp, s, *job_id, *step_id); !ok) {
    s.deferred_error = ok.error().message;
    log_error(fmt::format("job {}.{}: {}", *job_id, *step_id, ok.error().message));
  }
  return 0;  // user_init errors are not reported by 22.05: task_init raises them
}

int remote_task_init(spank_t sp) {
  auto& s = state();
  if (!s.active) return 0;
  if (!s.deferred_error.empty()) {
    // One line per node, not per task: slurmstepd already logged it once for the node.
    int local_task = -1;
    if (spank_get_item(sp, S_TASK_ID, &local_task) == ESPANK_SUCCESS && local_task == 0) {
      say("error: " + s.deferred_error);
    }
    return -1;
  }
  if (!s.plan) return 0;
  int local_task = -1;
  if (spank_get_item(sp, S_TASK_ID, &local_task) != ESPANK_SUCCESS || local_task < 0 ||
      local_task >= static_cast<int>(s.plan->tasks.size())) {
    say(fmt::format("error: no plan for local task {}", local_task));
    return -1;
  }
  const TaskPlan& task = s.plan->tasks[static_cast<std::size_t>(local_task)];

  auto allowed = current_affinity();
  if (!allowed) {
    say("error: " + allowed.error().message);
    return -1;
  }
  const BindingChoice binding = choose_binding(task.rank.cpus, *allowed, local_task);
  if (auto ok = set_affinity(binding.cpus); !ok) {
    if (s.site.enforce_binding) {
      say("error: " + ok.error().message);
      return -1;
    }
    log_error(ok.error().message);
  }
  auto memory = prefer_memory_node(task.rank.numa);
  if (!memory && s.site.enforce_binding) {
    say("error: " + memory.error().message);
    return -1;
  }

  Environment env = task.env;
  env[jobspec::env::kBoundCpus] = binding.cpus.to_list();
  env[jobspec::env::kMode] = std::string(to_string(s.mode));
  for (const auto& [name, value] : env) {
    const spank_err_t rc = spank_setenv(sp, name.c_str(), value.c_str(), 1);
    if (rc != ESPANK_SUCCESS) {
      say(fmt::format("error: cannot set {}: {}", name, spank_strerror(rc)));
      return -1;
    }
  }

  if (s.mode == Mode::verbose) {
    std::vector<std::string> gpus;
    for (int g : task.rank.gpus) gpus.push_back(std::to_string(g));
    const std::string busids = env_or(env, jobspec::env::kGpuBusids);
    std::string line = fmt::format(
        "{} task {} rank {}: gpu {}{} cores {} numa {} nic {}; bound to cpus {}", s.plan->node_name,
        local_task, task.rank.rank, gpus.empty() ? "-" : join(gpus),
        busids.empty() ? "" : " (" + busids + ")", task.rank.cpus.to_list(), task.rank.numa,
        task.rank.nics.empty() ? "-" : join(task.rank.nics), binding.cpus.to_list());
    if (binding.emulated) line += " (emulated node: intended cpus in TOPOLAUNCH_CPUS)";
    if (memory && !*memory) line += " (numa node not on this host: memory policy unchanged)";
    say(line);
  }
  return 0;
}

}  // namespace topolaunch::spank
