// The launcher's tables: [job] [mapping] [budget] [rdma] [wireup] [worker].
#include <set>
#include <sstream>

#include "tables.hpp"

namespace topolaunch::jobspec::detail {
namespace {

using namespace std::chrono_literals;

bool valid_job_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

constexpr std::uint64_t kTiB = std::uint64_t{1} << 40;

void read_explicit_rows(Reader& r, const toml::node& node, topology::MappingSpec& spec) {
  if (!node.is_array()) {
    return r.type_error(node, "mapping.explicit", "an array of tables", "[[mapping.explicit]]");
  }
  std::set<int> seen;
  for (const toml::node& row_node : *node.as_array()) {
    if (r.failed()) return;
    if (!row_node.is_table()) {
      return r.type_error(row_node, "mapping.explicit", "an array of tables",
                          "[[mapping.explicit]]");
    }
    const toml::table& row = *row_node.as_table();
    r.check_keys(row, "mapping.explicit");
    topology::ExplicitRank rank;
    rank.source_line = static_cast<int>(row.source().begin.line);
    r.integer(row, "mapping.explicit", "rank", rank.rank, 0, 1'000'000);
    r.integer(row, "mapping.explicit", "node", rank.node, 0, 100'000);
    if (r.failed()) return;
    if (!row.contains("rank") || !row.contains("node")) {
      return r.fail(row.source(), "mapping.explicit", "each row needs rank and node");
    }
    if (!seen.insert(rank.rank).second) {
      return r.fail(row.get("rank")->source(), "mapping.explicit.rank",
                    fmt::format("rank {} appears twice", rank.rank));
    }
    if (const toml::node* gpus = row.get("gpus")) {
      if (!gpus->is_array())
        return r.type_error(*gpus, "mapping.explicit.gpus", "an array", "[0, 1]");
      for (const toml::node& g : *gpus->as_array()) {
        if (!g.is_integer() || g.as_integer()->get() < 0 || g.as_integer()->get() > 1024) {
          return r.fail(g.source(), "mapping.explicit.gpus", "expected GPU indexes 0..1024");
        }
        rank.gpus.push_back(static_cast<int>(g.as_integer()->get()));
      }
    }
    std::string cpus;
    r.string(row, "mapping.explicit", "cpus", cpus, "\"0-15\"");
    if (!r.failed() && row.contains("cpus")) {
      rank.cpus = topology::CpuSet::parse_list(cpus);
      if (!rank.cpus || rank.cpus->empty()) {
        return r.fail(row.get("cpus")->source(), "mapping.explicit.cpus",
                      fmt::format("\"{}\" is not a CPU list (e.g. \"0-15,32-47\")", cpus));
      }
    }
    if (const toml::node* nics = row.get("nics")) {
      if (!nics->is_array())
        return r.type_error(*nics, "mapping.explicit.nics", "an array", "[\"mlx5_0\"]");
      for (const toml::node& n : *nics->as_array()) {
        if (!n.is_string())
          return r.fail(n.source(), "mapping.explicit.nics", "expected NIC names");
        rank.nics.emplace_back(n.as_string()->get());
      }
    }
    spec.explicit_ranks.push_back(std::move(rank));
  }
  if (r.failed()) return;
  for (int i = 0; i < static_cast<int>(seen.size()); ++i) {
    if (!seen.contains(i)) {
      return r.fail(
          node.source(), "mapping.explicit",
          fmt::format("ranks must be 0..{} without gaps; rank {} is missing", seen.size() - 1, i));
    }
  }
}

}  // namespace

void read_job(Reader& r, const toml::table& t, JobSection& job) {
  r.check_keys(t, "job");
  r.string(t, "job", "name", job.name, "\"gpt2-124m\"");
  if (!r.failed() && !valid_job_name(job.name)) {
    r.fail(t.get("name")->source(), "job.name",
           fmt::format("\"{}\" is not a job name (1-64 of A-Z a-z 0-9 . _ -)", job.name));
  }
  r.integer(t, "job", "nodes", job.nodes, 0, 100'000);
  r.integer(t, "job", "ranks_per_node", job.ranks_per_node, 0, 4096);
  r.integer(t, "job", "restarts", job.restarts, 0, 1000);
  r.duration(t, "job", "heartbeat_timeout", job.heartbeat_timeout, 0s, 7 * 24h);
  if (!r.failed() && job.heartbeat_timeout.count() != 0 && job.heartbeat_timeout < 100ms) {
    r.fail(t.get("heartbeat_timeout")->source(), "job.heartbeat_timeout",
           "must be \"0s\" (off) or at least \"100ms\"");
  }
  r.duration(t, "job", "progress_timeout", job.progress_timeout, 0s, 7 * 24h);
  // Below a second, a rank between two samples of its CPU time (every 200 ms or more) could be
  // taken for idle.
  if (!r.failed() && job.progress_timeout.count() != 0 && job.progress_timeout < 1s) {
    r.fail(t.get("progress_timeout")->source(), "job.progress_timeout",
           "must be \"0s\" (off) or at least \"1s\"");
  }
  r.duration(t, "job", "stop_grace", job.stop_grace, 0s, 1h);
  r.string(t, "job", "job_dir", job.job_dir, "\"runs/gpt2\"");
  r.string(t, "job", "checkpoint_dir", job.checkpoint_dir, "\"/scratch/ckpt\"");
  r.choice<StartMode>(t, "job", "start", job.start,
                      {{"checked", StartMode::checked}, {"early", StartMode::early}});
}

void check_start(Reader& r, const toml::table* job, const toml::table* mapping,
                 const toml::table* rdma, const JobConfig& c) {
  if (r.failed() || job == nullptr || c.job.start != StartMode::early) return;
  // Where the other key of a refusal was written: "line 12", or "" when it was not.
  auto line_of = [](const toml::table* t, std::string_view key) {
    const toml::node* node = t != nullptr ? t->get(key) : nullptr;
    return node != nullptr ? fmt::format("line {}", node->source().begin.line) : std::string();
  };
  // The workers start before any fabric check could pass; the preflight exists to stop a job
  // before work starts on a bad fabric, so the two do not go together.
  if (c.rdma.preflight != PreflightMode::off) {
    const std::string at = line_of(rdma, "preflight");
    return r.fail_at(*job, "job", "start",
                     fmt::format("\"early\" starts the workers before the [rdma] preflight could "
                                 "pass; set rdma.preflight = \"off\" (it is \"{}\", {}) or use "
                                 "start = \"checked\"",
                                 to_string(c.rdma.preflight), at.empty() ? "the default" : at));
  }
  // A node's ranks may depend only on its own topology and its place in Slurm's node order.
  if (!c.mapping.topology_conf.empty())
    return r.fail_at(
        *job, "job", "start",
        fmt::format("\"early\" needs the map's nodes in Slurm's order, and "
                    "mapping.topology_conf ({}) orders them by the switch tree; remove "
                    "it or use start = \"checked\"",
                    line_of(mapping, "topology_conf")));
}

void read_mapping(Reader& r, const toml::table& t, topology::MappingSpec& spec) {
  using topology::MappingPolicy;
  r.check_keys(t, "mapping");
  r.choice<MappingPolicy>(t, "mapping", "policy", spec.policy,
                          {{"auto", MappingPolicy::automatic},
                           {"block", MappingPolicy::block},
                           {"cyclic", MappingPolicy::cyclic},
                           {"explicit", MappingPolicy::explicit_table}});
  r.integer(t, "mapping", "ranks_per_gpu", spec.ranks_per_gpu, 1, 64);
  r.integer(t, "mapping", "gpus_per_rank", spec.gpus_per_rank, 1, 64);
  r.boolean(t, "mapping", "oversubscribe", spec.allow_oversubscribe);
  r.integer(t, "mapping", "tensor", spec.tensor, 1, 4096);
  r.integer(t, "mapping", "pipeline", spec.pipeline, 1, 4096);
  r.integer(t, "mapping", "data", spec.data, 0, 1'000'000);
  r.boolean(t, "mapping", "pin_nics", spec.pin_nics);
  r.boolean(t, "mapping", "bind_memory", spec.bind_memory);
  r.string(t, "mapping", "topology_conf", spec.topology_conf, "\"/etc/slurm/topology.conf\"");
  if (r.failed()) return;
  if (spec.ranks_per_gpu > 1 && spec.gpus_per_rank > 1) {
    return r.fail(t.get("gpus_per_rank")->source(), "mapping.gpus_per_rank",
                  "ranks_per_gpu and gpus_per_rank cannot both be above 1");
  }
  if (const toml::node* rows = t.get("explicit")) read_explicit_rows(r, *rows, spec);
  if (r.failed()) return;
  bool is_explicit = spec.policy == MappingPolicy::explicit_table;
  if (is_explicit && spec.explicit_ranks.empty()) {
    return r.fail(t.get("policy")->source(), "mapping.policy",
                  "\"explicit\" needs [[mapping.explicit]] rows (rank, node, gpus)");
  }
  if (!is_explicit && !spec.explicit_ranks.empty()) {
    return r.fail(t.get("explicit")->source(), "mapping.explicit",
                  "rows are only used with policy = \"explicit\"");
  }
}

void read_budget(Reader& r, const toml::table& t, BudgetSection& budget) {
  r.check_keys(t, "budget");
  r.size(t, "budget", "memory", budget.memory_bytes_per_rank, 64 * kTiB);
  if (!r.failed() && t.contains("memory") && budget.memory_bytes_per_rank < (1u << 20)) {
    r.fail(t.get("memory")->source(), "budget.memory",
           fmt::format("{} is too small for any process (at least 1MiB, or 0 for no budget)",
                       format_size(budget.memory_bytes_per_rank)));
  }
  r.size(t, "budget", "gpu_memory", budget.gpu_memory_bytes_per_rank, 4 * kTiB);
  r.size(t, "budget", "comm_per_step", budget.comm_bytes_per_step, 1024 * kTiB);
  r.duration(t, "budget", "comm_exposed_per_step", budget.comm_exposed_time_per_step, 0s, 24h);
}

void read_rdma(Reader& r, const toml::table& t, RdmaSection& rdma) {
  r.check_keys(t, "rdma");
  r.string(t, "rdma", "nics", rdma.nics_text, "\"mlx5_0,mlx5_1\"");
  if (!r.failed() && !rdma.nics_text.empty()) {
    auto filter = topology::NicFilter::parse(rdma.nics_text);
    if (!filter) return r.fail(t.get("nics")->source(), "rdma.nics", filter.error().message);
    rdma.nics = *filter;
  }
  r.choice<PreflightMode>(t, "rdma", "preflight", rdma.preflight,
                          {{"off", PreflightMode::off},
                           {"quick", PreflightMode::quick},
                           {"full", PreflightMode::full}});
  r.choice<GpuDirectPolicy>(t, "rdma", "gpudirect", rdma.gpudirect,
                            {{"auto", GpuDirectPolicy::automatic},
                             {"require", GpuDirectPolicy::require},
                             {"off", GpuDirectPolicy::off}});
  r.number(t, "rdma", "min_bandwidth_gbps", rdma.min_bandwidth_gbps, 0.0, 10'000.0);
  r.duration(t, "rdma", "max_latency", rdma.max_latency, 0s, 10s);
  r.duration(t, "rdma", "preflight_timeout", rdma.preflight_timeout, 1s, 1h);
}

void read_wireup(Reader& r, const toml::table& t, WireupSection& wireup) {
  r.check_keys(t, "wireup");
  r.choice<WireupBackend>(t, "wireup", "backend", wireup.backend,
                          {{"auto", WireupBackend::automatic},
                           {"tcp", WireupBackend::tcp},
                           {"pmix", WireupBackend::pmix},
                           {"pmi2", WireupBackend::pmi2}});
  r.integer(t, "wireup", "port", wireup.port, 0, 65535);
  if (!r.failed() && wireup.port != 0 && wireup.port < 1024) {
    r.fail(t.get("port")->source(), "wireup.port",
           fmt::format("{} is a privileged port (use 0 for any free port, or 1024..65535)",
                       wireup.port));
  }
  r.duration(t, "wireup", "timeout", wireup.timeout, 100ms, 24h);
}

void read_worker(Reader& r, const toml::table& t, WorkerSection& worker) {
  r.check_keys(t, "worker");
  if (const toml::node* command = t.get("command"); command && !r.failed()) {
    worker.command.clear();
    if (command->is_string()) {
      // A string is split on blanks (no shell quoting); use an array for arguments with spaces.
      std::istringstream words(std::string(command->as_string()->get()));
      for (std::string word; words >> word;) worker.command.push_back(word);
    } else if (command->is_array()) {
      for (const toml::node& word : *command->as_array()) {
        if (!word.is_string()) {
          return r.fail(word.source(), "worker.command",
                        fmt::format("expected strings, got {} (e.g. command = [\"python\", "
                                    "\"train.py\"])",
                                    type_name(word)));
        }
        worker.command.emplace_back(word.as_string()->get());
      }
    } else {
      return r.type_error(*command, "worker.command", "an array of strings",
                          "[\"python\", \"train.py\"]");
    }
    if (worker.command.empty() || worker.command[0].empty()) {
      return r.fail(command->source(), "worker.command", "is empty (name a program)");
    }
  }
  if (const toml::table* env = r.table(t, "worker", "env")) {
    for (auto&& [key, value] : *env) {
      std::string dotted = fmt::format("worker.env.{}", key.str());
      if (!value.is_string()) {
        return r.fail(value.source(), dotted,
                      fmt::format("expected a string, got {} (quote it: {} = \"...\")",
                                  type_name(value), key.str()));
      }
      if (key.str().empty() || key.str().find('=') != std::string_view::npos) {
        return r.fail(key.source(), dotted, "is not an environment variable name");
      }
      worker.env[std::string(key.str())] = value.as_string()->get();
    }
  }
}

}  // namespace topolaunch::jobspec::detail
