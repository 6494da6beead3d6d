// The job file's launcher tables ([job] [mapping] [budget] [rdma] [wireup] [worker]), the
// top-level schema and the example configs. The worker's tables: test_worker_tables.cpp.
#include <filesystem>
#include <string>

#include "catch.hpp"
#include "topolaunch/jobspec/job_config.hpp"

using namespace topolaunch::jobspec;
using namespace std::chrono_literals;

namespace {

std::string error_of(const std::string& toml) {
  auto r = parse_job_config(toml, "job.toml");
  if (r.ok()) return "(parsed fine)";
  CHECK(r.error().exit_code == 2);
  CHECK(r.error().message.find('\n') == std::string::npos);  // one line
  return r.error().message;
}

}  // namespace

TEST_CASE("an empty config is valid and means: built-in worker, defaults everywhere") {
  auto r = parse_job_config("", "job.toml");
  REQUIRE(r.ok());
  CHECK_FALSE(r->model.has_value());
  CHECK(r->job.name == "job");
  CHECK(r->job.restarts == 0);
  CHECK(r->job.heartbeat_timeout == 0ms);
  CHECK(r->worker.command == std::vector<std::string>{"topolaunch-worker"});
  CHECK(r->rdma.preflight == PreflightMode::quick);
  CHECK(r->wireup.port == 0);
}

TEST_CASE("a full config reads every table") {
  auto r = parse_job_config(R"(
[job]
name = "gpt2-124m"
nodes = 4
ranks_per_node = 8
restarts = 3
heartbeat_timeout = "90s"
stop_grace = "15s"
job_dir = "runs/gpt2"
[mapping]
policy = "block"
tensor = 2
bind_memory = false
[budget]
memory = "16GiB"
gpu_memory = "70GiB"
comm_per_step = "25MiB"
comm_exposed_per_step = "20ms"
[rdma]
preflight = "full"
gpudirect = "require"
min_bandwidth_gbps = 180
max_latency = "5us"
[wireup]
backend = "tcp"
port = 29400
[worker]
command = ["python", "train.py", "--lr", "3e-4"]
env = { OMP_NUM_THREADS = "4" }
[model]
n_layer = 12
[train]
steps = 100
)",
                            "job.toml");
  REQUIRE(r.ok());
  CHECK(r->job.name == "gpt2-124m");
  CHECK(r->job.nodes == 4);
  CHECK(r->job.ranks_per_node == 8);
  CHECK(r->mapping.ranks_per_node == 8);
  CHECK(r->job.restarts == 3);
  CHECK(r->job.heartbeat_timeout == 90s);
  CHECK(r->job.stop_grace == 15s);
  CHECK(r->job.job_dir == "runs/gpt2");
  CHECK(r->mapping.policy == topolaunch::topology::MappingPolicy::block);
  CHECK(r->mapping.tensor == 2);
  CHECK_FALSE(r->mapping.bind_memory);
  CHECK(r->budget.memory_bytes_per_rank == 16ull << 30);
  CHECK(r->budget.gpu_memory_bytes_per_rank == 70ull << 30);
  CHECK(r->budget.comm_bytes_per_step == 25ull << 20);
  CHECK(r->budget.comm_exposed_time_per_step == 20ms);
  CHECK(r->rdma.preflight == PreflightMode::full);
  CHECK(r->rdma.gpudirect == GpuDirectPolicy::require);
  CHECK(r->rdma.min_bandwidth_gbps == 180.0);
  CHECK(r->rdma.max_latency == 5us);
  CHECK(r->wireup.backend == WireupBackend::tcp);
  CHECK(r->wireup.port == 29400);
  CHECK(r->worker.command == std::vector<std::string>{"python", "train.py", "--lr", "3e-4"});
  CHECK(r->worker.env.at("OMP_NUM_THREADS") == "4");
  REQUIRE(r->model.has_value());
  CHECK(r->model->n_layer == 12);
  CHECK(r->train.steps == 100);
  CHECK(r->data.kind == DataKind::text);
}

TEST_CASE("a size with a decimal unit names file, line, column and key") {
  CHECK(error_of("[budget]\nmemory = \"16GB\"\n") ==
        "job.toml:2:10: budget.memory: \"16GB\" is not a size (decimal units are ambiguous "
        "here) (use binary units B, KiB, MiB, GiB, TiB, e.g. \"16GiB\")");
}

TEST_CASE("TOML syntax errors name the position") {
  std::string e = error_of("[job]\nname = \"x\nrestarts = 1\n");
  CHECK(e.rfind("job.toml:2:", 0) == 0);
  CHECK(e.find("TOML syntax error") != std::string::npos);
  CHECK(error_of("[job\n").rfind("job.toml:1:", 0) == 0);
  CHECK(error_of("[job]\nrestarts = 1\nrestarts = 2\n").rfind("job.toml:3:", 0) == 0);
}

TEST_CASE("unknown keys get a did-you-mean from the same table") {
  CHECK(error_of("[job]\nrestart = 2\n") ==
        "job.toml:2:1: job.restart: unknown key (did you mean \"restarts\"?)");
  CHECK(error_of("[budget]\nmemroy = \"1GiB\"\n") ==
        "job.toml:2:1: budget.memroy: unknown key (did you mean \"memory\"?)");
  CHECK(error_of("[jobs]\nname = \"x\"\n") ==
        "job.toml:1:2: jobs: unknown table (did you mean \"job\"?)");
}

TEST_CASE("a key in the wrong table says where it belongs") {
  CHECK(error_of("[budget]\nrestarts = 2\n") ==
        "job.toml:2:1: budget.restarts: unknown key (it belongs in [job])");
}

TEST_CASE("an unknown key with nothing close lists the known keys") {
  std::string e = error_of("[wireup]\nzzzzzzzzzz = 1\n");
  CHECK(e.find("wireup.zzzzzzzzzz: unknown key (known keys: backend, port, timeout)") !=
        std::string::npos);
}

TEST_CASE("wrong types are refused with an example") {
  CHECK(error_of("[job]\nrestarts = \"3\"\n") ==
        "job.toml:2:12: job.restarts: expected an integer, got a string (e.g. restarts = 1)");
  CHECK(error_of("[job]\nheartbeat_timeout = 90\n") ==
        "job.toml:2:21: job.heartbeat_timeout: expected a duration, got an integer (e.g. "
        "heartbeat_timeout = \"90s\")");
  CHECK(error_of("job = 3\n").find("job: expected a table, got an integer") != std::string::npos);
  CHECK(error_of("[worker]\ncommand = 5\n").find("worker.command: expected an array of strings") !=
        std::string::npos);
  CHECK(error_of("[worker]\ncommand = [\"a\", 1]\n").find("worker.command: expected strings") !=
        std::string::npos);
  CHECK(error_of("[worker]\nenv = { A = 1 }\n").find("worker.env.A: expected a string") !=
        std::string::npos);
  CHECK(error_of("[mapping]\nbind_memory = \"yes\"\n").find("expected true or false") !=
        std::string::npos);
}

TEST_CASE("negative and absurd values are refused") {
  CHECK(error_of("[job]\nrestarts = -1\n") ==
        "job.toml:2:12: job.restarts: -1 is out of range (allowed 0..1000)");
  CHECK(error_of("[job]\nnodes = 10000000\n").find("out of range") != std::string::npos);
  CHECK(error_of("[budget]\nmemory = -5\n").find("budget.memory: -5 is negative") !=
        std::string::npos);
  CHECK(error_of("[budget]\nmemory = \"100PiB\"\n").find("absurdly large") != std::string::npos);
  CHECK(error_of("[budget]\nmemory = \"1KiB\"\n").find("too small") != std::string::npos);
  CHECK(error_of("[job]\nheartbeat_timeout = \"1ms\"\n").find("at least \"100ms\"") !=
        std::string::npos);
  CHECK(error_of("[job]\nheartbeat_timeout = \"30d\"\n").find("out of range") != std::string::npos);
  CHECK(error_of("[wireup]\nport = 80\n").find("privileged port") != std::string::npos);
  CHECK(error_of("[wireup]\nport = 70000\n").find("out of range") != std::string::npos);
  CHECK(error_of("[rdma]\nmin_bandwidth_gbps = -3.0\n").find("out of range") != std::string::npos);
}

TEST_CASE("words outside their set list the choices") {
  CHECK(error_of("[rdma]\npreflight = \"fast\"\n") ==
        "job.toml:2:13: rdma.preflight: \"fast\" is not one of \"off\", \"quick\", \"full\"");
  CHECK(error_of("[mapping]\npolicy = \"random\"\n").find("mapping.policy") != std::string::npos);
}

TEST_CASE("job names and commands are checked") {
  CHECK(error_of("[job]\nname = \"my job/1\"\n").find("is not a job name") != std::string::npos);
  CHECK(error_of("[worker]\ncommand = []\n").find("worker.command: is empty") != std::string::npos);
  auto r = parse_job_config("[worker]\ncommand = \"python  train.py\"\n", "job.toml");
  REQUIRE(r.ok());
  CHECK(r->worker.command == std::vector<std::string>{"python", "train.py"});
}

TEST_CASE("explicit mapping rows: complete, unique, and only with policy explicit") {
  auto r = parse_job_config(R"(
[mapping]
policy = "explicit"
[[mapping.explicit]]
rank = 0
node = 0
gpus = [0]
cpus = "0-7"
[[mapping.explicit]]
rank = 1
node = 0
gpus = [1]
nics = ["mlx5_0"]
)",
                            "job.toml");
  REQUIRE(r.ok());
  REQUIRE(r->mapping.explicit_ranks.size() == 2);
  CHECK(r->mapping.explicit_ranks[0].cpus->to_list() == "0-7");
  CHECK(r->mapping.explicit_ranks[1].nics == std::vector<std::string>{"mlx5_0"});
  CHECK(r->mapping.explicit_ranks[1].source_line == 9);
  CHECK(error_of("[mapping]\npolicy = \"explicit\"\n").find("needs [[mapping.explicit]]") !=
        std::string::npos);
  CHECK(error_of("[[mapping.explicit]]\nrank = 0\nnode = 0\n").find("only used with policy") !=
        std::string::npos);
  CHECK(error_of("[mapping]\npolicy = \"explicit\"\n[[mapping.explicit]]\nrank = 0\nnode = 0\n"
                 "[[mapping.explicit]]\nrank = 0\nnode = 1\n")
            .find("rank 0 appears twice") != std::string::npos);
  CHECK(error_of("[mapping]\npolicy = \"explicit\"\n[[mapping.explicit]]\nrank = 1\nnode = 0\n")
            .find("rank 0 is missing") != std::string::npos);
  CHECK(error_of("[mapping]\npolicy = \"explicit\"\n[[mapping.explicit]]\nrank = 0\nnode = 0\n"
                 "cpus = \"7-3\"\n")
            .find("is not a CPU list") != std::string::npos);
}

TEST_CASE("job.start: \"checked\" by default, \"early\" when asked with the preflight off") {
  auto checked = parse_job_config("", "job.toml");
  REQUIRE(checked.ok());
  CHECK(checked->job.start == StartMode::checked);
  auto early =
      parse_job_config("[job]\nstart = \"early\"\n[rdma]\npreflight = \"off\"\n", "job.toml");
  REQUIRE(early.ok());
  CHECK(early->job.start == StartMode::early);
  CHECK(describe(*early).find("start      early") != std::string::npos);
  CHECK(describe(*checked).find("start ") == std::string::npos);
  auto explicitly = parse_job_config("[job]\nstart = \"checked\"\n", "job.toml");
  REQUIRE(explicitly.ok());
  CHECK(explicitly->job.start == StartMode::checked);
  CHECK(is_schema_key("job.start"));
}

TEST_CASE("job.start: another word lists the two") {
  CHECK(error_of("[job]\nstart = \"eager\"\n") ==
        "job.toml:2:9: job.start: \"eager\" is not one of \"checked\", \"early\"");
  CHECK(
      error_of("[job]\nstart = true\n").find("job.start: expected one of \"checked\", \"early\"") !=
      std::string::npos);
}

TEST_CASE("job.start = \"early\" is refused with a preflight, named at job.start") {
  // The default preflight is "quick": early start needs it off, said where start was written.
  CHECK(error_of("[job]\nname = \"a\"\nstart = \"early\"\n") ==
        "job.toml:3:9: job.start: \"early\" starts the workers before the [rdma] preflight could "
        "pass; set rdma.preflight = \"off\" (it is \"quick\", the default) or use start = "
        "\"checked\"");
  CHECK(error_of("[job]\nstart = \"early\"\n[rdma]\npreflight = \"full\"\n") ==
        "job.toml:2:9: job.start: \"early\" starts the workers before the [rdma] preflight could "
        "pass; set rdma.preflight = \"off\" (it is \"full\", line 4) or use start = \"checked\"");
  // A refusal of `topolaunch check` and `run` alike: bad input, exit status 2 (error_of checks).
  auto r = parse_job_config("[job]\nstart = \"early\"\n", "job.toml");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().exit_code == 2);
}

TEST_CASE("job.start = \"early\" is refused with a switch tree ordering the nodes") {
  CHECK(
      error_of("[job]\nstart = \"early\"\n[mapping]\ntopology_conf = \"/etc/slurm/topology.conf\"\n"
               "[rdma]\npreflight = \"off\"\n") ==
      "job.toml:2:9: job.start: \"early\" needs the map's nodes in Slurm's order, and "
      "mapping.topology_conf (line 4) orders them by the switch tree; remove it or use start = "
      "\"checked\"");
  // "checked" takes either.
  CHECK(parse_job_config("[job]\nstart = \"checked\"\n[mapping]\ntopology_conf = \"t.conf\"\n",
                         "job.toml")
            .ok());
}

TEST_CASE("job.start from --set is checked like the file") {
  auto r = parse_job_config("[rdma]\npreflight = \"off\"\n", "job.toml", {"job.start=early"});
  REQUIRE(r.ok());
  CHECK(r->job.start == StartMode::early);
  auto bad = parse_job_config("", "job.toml", {"job.start=early"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("--set job.start=early:") == 0);
  CHECK(bad.error().message.find("rdma.preflight = \"off\"") != std::string::npos);
}

TEST_CASE("a missing file is one clear line") {
  auto r = load_job_config("/nonexistent/job.toml");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == "/nonexistent/job.toml: cannot read the job config (check the path)");
}

TEST_CASE("every example config in configs/jobs is valid") {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(TOPOLAUNCH_SOURCE_ROOT) / "configs" / "jobs";
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    INFO(entry.path().string());
    auto r = load_job_config(entry.path().string());
    if (!r.ok()) FAIL(r.error().message);
    ++count;
  }
  CHECK(count >= 3);
}
