// The real topodiag binary (path in $TOPODIAG): baseline round trip through files, bad input,
// usage errors, the live host, --gres and --dot. Runs processes, so it asserts exit statuses
// and output lines, never internals.
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catch.hpp"
#include "diag_fixtures.hpp"

extern char** environ;

namespace fs = std::filesystem;
using topolaunch::topology::diagtest::generated;
using topolaunch::topology::diagtest::negative;
using topolaunch::topology::diagtest::slurp;

namespace {

struct Run {
  int status = -1;
  std::string out;
  std::string err;
};

// A temporary directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "topodiag-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed");
    }
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

Run run_program(const std::string& program, const std::vector<std::string>& args,
                const std::string& stdout_path = {}) {
  TempDir tmp;
  const std::string out_path = stdout_path.empty() ? tmp / "stdout" : stdout_path;
  const std::string err_path = tmp / "stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> argv_storage{program};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    throw std::runtime_error("cannot start " + program + ": " + std::strerror(rc));
  }
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  Run r;
  r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

Run topodiag(const std::vector<std::string>& args) {
  return run_program(topolaunch::topology::diagtest::env("TOPODIAG"), args);
}

std::vector<std::string> finding_codes(const std::string& json_text) {
  std::vector<std::string> codes;
  const auto doc = nlohmann::json::parse(json_text);
  for (const auto& f : doc.at("findings")) {
    if (f.at("severity") != "info") {
      codes.push_back(f.at("code").get<std::string>());
    }
  }
  return codes;
}

std::size_t count_lines(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("baseline round trip: save from DGX H100, then each edited fixture gives its code") {
  TempDir tmp;
  const std::string baseline = tmp / "dgx-h100.baseline.json";
  const Run saved =
      topodiag({"--input", generated("dgx-h100.full.xml"), "--save-baseline", baseline, "--json"});
  REQUIRE(saved.status == 0);
  REQUIRE(saved.err.empty());
  REQUIRE(fs::file_size(baseline) > 0);
  CHECK(nlohmann::json::parse(slurp(baseline))["gpus"].size() == 8);

  SECTION("the same node matches its baseline: exit 0, no finding") {
    const Run r = topodiag({"--input", generated("dgx-h100.full.xml"), "--baseline", baseline});
    CHECK(r.status == 0);
    CHECK(contains(r.out, "Findings: none"));
  }
  SECTION("the JSON baseline itself can be the input") {
    const Run r = topodiag({"--input", baseline, "--baseline", baseline, "--json"});
    CHECK(r.status == 0);
    CHECK(finding_codes(r.out).empty());
  }

  struct Case {
    const char* file;
    const char* code;
    int status;
  };
  const Case cases[] = {
      {"dgx-h100.gpu-missing.xml", "TOPO101", 1}, {"dgx-h100.link-x8.xml", "TOPO401", 1},
      {"dgx-h100.nic-down.xml", "TOPO201", 1},    {"dgx-h100.nvlink17.xml", "TOPO501", 1},
      {"dgx-h100.no-locality.xml", "TOPO302", 1},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.file << " -> " << c.code << ", exit " << c.status) {
      const Run json = topodiag({"--input", negative(c.file), "--baseline", baseline, "--json"});
      CHECK(json.status == c.status);
      const auto codes = finding_codes(json.out);
      CHECK(std::find(codes.begin(), codes.end(), c.code) != codes.end());
      CHECK(nlohmann::json::parse(json.out)["exit_status"] == c.status);
      const Run human = topodiag({"--input", negative(c.file), "--baseline", baseline});
      CHECK(human.status == c.status);
      CHECK(contains(human.out, std::string("  ") + c.code + " error "));
    }
  }
  SECTION("the human finding line for the x8 link") {
    const Run r = topodiag({"--input", negative("dgx-h100.link-x8.xml"), "--baseline", baseline});
    CHECK(contains(r.out,
                   "\n  TOPO401 error GPU3 0000:61:00.0: PCIe width expected x16, found "
                   "x8\n"));
  }
  SECTION("a Debian-style XML without NVLink data vs an NVLink baseline: exit 4") {
    const Run r = topodiag({"--input", generated("dgx-h100.pci.xml"), "--baseline", baseline});
    CHECK(r.status == 4);
    CHECK(contains(r.out, "TOPO901 warning node:"));
  }
}

TEST_CASE("our capture of a live 2x H200 node (topodiag with NVML on the GPU host) replays") {
  // tests/fixtures/topology/h200x2.*: topodiag --json / --save-baseline on an nvidia-h200-x2
  // device machine (tests/gpu/compare_topology.py, where nvidia-smi topo -m agreed on all 9 checks)
  const std::string baseline = topolaunch::topology::diagtest::env("TOPOLAUNCH_FIXTURES_DIR") +
                               "/topology/h200x2.baseline.json";
  const Run r = topodiag({"--input", baseline, "--baseline", baseline, "--json"});
  CHECK(r.status == 0);
  CHECK(finding_codes(r.out).empty());
  const auto doc = nlohmann::json::parse(r.out);
  REQUIRE(doc.at("gpus").size() == 2);
  CHECK(doc.at("gpus")[0].at("busid") == "0000:00:06.0");
  CHECK(doc.at("gpus")[1].at("busid") == "0000:00:07.0");
  CHECK(doc.at("gpus")[0].at("numa") == 0);
  CHECK(doc.at("matrix").at("GPU0").at("GPU1") == "NV18");
  CHECK(doc.at("matrix").at("GPU1").at("GPU0") == "NV18");
}

TEST_CASE("--baseline also accepts an hwloc XML") {
  const Run r = topodiag({"--input", negative("dgx-h100.nic-down.xml"), "--baseline",
                          generated("dgx-h100.full.xml"), "--json"});
  CHECK(r.status == 1);
  CHECK(finding_codes(r.out) == std::vector<std::string>{"TOPO201"});
}

TEST_CASE("bad input: exit 2, nothing on stdout, exactly one line on stderr naming the file") {
  TempDir tmp;
  // Section names must not change between Catch2's re-runs of the test case: fixed paths only.
  const std::string cases[] = {
      negative("does-not-exist.xml"), negative("empty.xml"),
      negative("truncated.xml"),      negative("v3.xml"),
      negative("junk.bin"),           negative(""),
  };
  for (const std::string& file : cases) {
    DYNAMIC_SECTION("--input " << file) {
      const Run r = topodiag({"--input", file});
      CHECK(r.status == 2);
      CHECK(r.out.empty());
      CHECK(count_lines(r.err) == 1);
      CHECK(r.err.rfind("topodiag: ", 0) == 0);
      CHECK(contains(r.err, file));
    }
    DYNAMIC_SECTION("--baseline " << file) {
      const Run r = topodiag({"--input", generated("dgx-h100.full.xml"), "--baseline", file});
      CHECK(r.status == 2);
      CHECK(r.out.empty());
      CHECK(count_lines(r.err) == 1);
      CHECK(contains(r.err, file));
    }
  }
  SECTION("v3 says which versions are read") {
    const Run r = topodiag({"--input", negative("v3.xml")});
    CHECK(contains(r.err, "3.0"));
  }
  SECTION("an unwritable --save-baseline is one line and exit 2") {
    const Run r = topodiag({"--input", generated("dgx-h100.full.xml"), "--save-baseline",
                            tmp / "no-such-dir/base.json"});
    CHECK(r.status == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(contains(r.err, "--save-baseline"));
  }
}

TEST_CASE("usage errors exit 2 with one line; --help and --version exit 0") {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--no-such-option"}, {"--json", "--dot"}, {"--gres", "--json"}, {"--input"}}) {
    const Run r = topodiag(args);
    CHECK(r.status == 2);
    CHECK(count_lines(r.err) == 1);
  }
  const Run help = topodiag({"--help"});
  CHECK(help.status == 0);
  CHECK(contains(help.out, "--baseline"));
  CHECK(contains(help.out, "--save-baseline"));
  const Run version = topodiag({"--version"});
  CHECK(version.status == 0);
  CHECK(version.out.rfind("topodiag ", 0) == 0);
}

TEST_CASE("a CPU-only node says so plainly and exits 0") {
  const Run r = topodiag({"--input", negative("cpu-only.xml")});
  CHECK(r.status == 0);
  CHECK(contains(r.out, "No NVIDIA GPU and no RDMA NIC found"));
  CHECK(contains(r.out, "2 sockets, 16 cores, 32 threads"));
  CHECK(r.err.empty());
}

TEST_CASE("the live host: runs, and on a host without GPU and NIC says so and exits 0") {
  const Run r = topodiag({});
  REQUIRE(r.err.empty());
  CHECK(contains(r.out, "Node "));
  const bool has_nvidia = fs::exists("/proc/driver/nvidia/gpus");
  const bool has_rdma =
      fs::exists("/sys/class/infiniband") && !fs::is_empty("/sys/class/infiniband");
  if (!has_nvidia && !has_rdma) {
    CHECK(r.status == 0);
    CHECK(contains(r.out, "No NVIDIA GPU and no RDMA NIC found"));
  } else {
    CHECK(r.status != 2);
  }
}

TEST_CASE("--nics excludes storage NICs from the compute role") {
  const Run r = topodiag({"--input", generated("dgx-h100.full.xml"), "--nics",
                          "^=mlx5_1,mlx5_2,mlx5_7,mlx5_8", "--json"});
  CHECK(r.status == 0);
  const auto doc = nlohmann::json::parse(r.out);
  CHECK(doc["nics"][1]["role"] == "excluded");
  CHECK(doc["nics"][0]["role"] == "compute");
}

TEST_CASE("--gres prints gres.conf and slurm.conf lines") {
  const Run r = topodiag({"--input", generated("dgx-h100.full.xml"), "--gres"});
  CHECK(r.status == 0);
  CHECK(contains(r.out, "Name=gpu File=/dev/nvidia3 Cores=0-55"));
  CHECK(contains(r.out, "NodeName="));
  CHECK(contains(r.out, "Gres=gpu:8"));
}

TEST_CASE("--dot output is valid Graphviz (dot renders it)") {
  TempDir tmp;
  const Run r = topodiag({"--input", generated("dgx-h100.full.xml"), "--dot"});
  REQUIRE(r.status == 0);
  { std::ofstream(tmp / "node.dot") << r.out; }
  // graphviz is a prerequisite of the test suite (README set-up); fail loudly without it.
  const Run dot = run_program("dot", {"-Tsvg", "-o", tmp / "node.svg", tmp / "node.dot"});
  CHECK(dot.status == 0);
  CHECK(dot.err.empty());
  CHECK(contains(slurp(tmp / "node.svg"), "NVSwitch fabric"));
}

TEST_CASE("a corrupt or foreign JSON baseline is exit 2 with one line") {
  TempDir tmp;
  const std::string texts[] = {"{", "{\"version\": 99}", "{\"version\": 1, \"gpus\": \"x\"}",
                               "[1, 2]"};
  int n = 0;
  for (const std::string& text : texts) {
    const std::string file = tmp / ("baseline" + std::to_string(n++) + ".json");
    std::ofstream(file) << text << '\n';
    const Run r = topodiag({"--input", generated("dgx-h100.full.xml"), "--baseline", file});
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK(count_lines(r.err) == 1);
    CHECK(contains(r.err, "--baseline"));
  }
}

TEST_CASE("warnings only exit 3, or 0 with --warnings-ok") {
  const Run warned = topodiag({"--input", negative("dgx-h100.no-locality.xml")});
  CHECK(warned.status == 3);
  CHECK(contains(warned.out, "TOPO302 warning node:"));
  const Run ok = topodiag({"--input", negative("dgx-h100.no-locality.xml"), "--warnings-ok"});
  CHECK(ok.status == 0);
}
