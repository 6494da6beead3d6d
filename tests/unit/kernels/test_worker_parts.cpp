// The worker's pure parts: config parsing errors, data decoding (janeaustenr, llm.c tokens, text
// checks), checkpoints round trip, and the TCP ring all-reduce with ranks as threads.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "catch.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/communicator.hpp"
#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/job.hpp"
#include "topolaunch/kernels/plan.hpp"
#include "topolaunch/kernels/worker.hpp"

using namespace topolaunch::kernels;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tl-kunit-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
};

}  // namespace

TEST_CASE("config: unknown key in [train] names file:line:column and the key") {
  TempDir d;
  auto p = d.write("job.toml", "[model]\nn_layer = 1\n[train]\nbatch = 2\nlearnin_rate = 1e-3\n");
  auto c = load_worker_config(p.string());
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().exit_code == 2);
  CHECK_THAT(c.error().message, Catch::Contains("job.toml:5:1: train.learnin_rate: unknown key"));
}

TEST_CASE(
    "config: launcher tables are ignored, [budget] sizes parsed in binary units, --set overrides") {
  TempDir d;
  auto p = d.write("job.toml",
                   "[job]\nname = \"x\"\n[model]\nn_layer = 1\nn_embd = 8\nn_head = "
                   "2\n[budget]\nmemory = \"1.5GiB\"\n"
                   "comm_exposed_per_step = \"20ms\"\n[train]\nbatch = 2\nseq_len = 8\n");
  auto c = load_worker_config(p.string(), {"train.steps=7", "data.path=/tmp/x"});
  REQUIRE(c.ok());
  CHECK(c->budget.memory_bytes == 3ull << 29);
  CHECK(c->budget.comm_exposed_ms_per_step == 20.0);
  CHECK(c->train.steps == 7);
  CHECK(c->data.path == "/tmp/x");
  auto bad = d.write("bad.toml", "[model]\nn_layer = 1\n[budget]\nmemory = \"16GB\"\n");
  auto e = load_worker_config(bad.string());
  REQUIRE_FALSE(e.ok());
  CHECK_THAT(e.error().message,
             Catch::Contains("bad.toml:4:10: budget.memory: \"16GB\" is not a size"));
}

TEST_CASE("janeaustenr: the six novels decode from R's lazy-load database") {
  const std::string rdb = "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb";
  if (!fs::exists(rdb))
    FAIL("r-cran-janeaustenr is not installed (apt-get install r-cran-janeaustenr)");
  auto text = decode_r_lazyload_text(rdb);
  REQUIRE(text.ok());
  // research/static_graph.md: 4,025,022 characters in 73,422 lines; we add one '\n' per line.
  const auto lines = static_cast<std::size_t>(std::count(text->begin(), text->end(), '\n'));
  CHECK(lines == 73422);
  CHECK(text->size() == 4025022 + 7);
  CHECK(text->find("It is a truth universally acknowledged") != std::string::npos);
  CHECK(text->find("Emma Woodhouse, handsome, clever, and rich") != std::string::npos);
  auto d = char_level_dataset(*text, "austen");
  REQUIRE(d.ok());
  CHECK(d->vocab_size == 82);  // 81 characters + newline
}

TEST_CASE("data: empty, binary and missing files are refused; text folders are concatenated") {
  TempDir d;
  auto empty = read_text(d.write("empty.txt", "").string());
  REQUIRE_FALSE(empty.ok());
  CHECK_THAT(empty.error().message, Catch::Contains("is empty"));
  auto binary = read_text(d.write("bin.txt", std::string("abc\0\x01\x02", 6)).string());
  REQUIRE_FALSE(binary.ok());
  CHECK_THAT(binary.error().message, Catch::Contains("is not a text file"));
  CHECK_FALSE(read_text((d.path / "missing").string()).ok());
  fs::create_directory(d.path / "folder");
  d.write("folder/b.txt", "world\n");
  d.write("folder/a.txt", "hello ");
  auto folder = read_text((d.path / "folder").string());
  REQUIRE(folder.ok());
  CHECK(*folder == "hello world\n");
}

TEST_CASE("llm.c token files: header checked, tokens read; bad magic and short files refused") {
  TempDir d;
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 3;
  const std::vector<std::uint16_t> toks = {50256, 15496, 11};
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(toks.data()), 6);
  auto ok = load_token_file(d.write("ok.bin", bytes).string());
  REQUIRE(ok.ok());
  CHECK(ok->tokens == std::vector<std::int32_t>{50256, 15496, 11});
  CHECK(ok->vocab_size == 50257);
  std::string bad = bytes;
  bad[0] = 1;
  auto e = load_token_file(d.write("bad.bin", bad).string());
  REQUIRE_FALSE(e.ok());
  CHECK_THAT(e.error().message, Catch::Contains("bad magic"));
  auto s = load_token_file(d.write("short.bin", bytes.substr(0, 1026)).string());
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message, Catch::Contains("header says 3 tokens"));
}

TEST_CASE(
    "checkpoint round trip restores parameters, optimizer state, step, data position and RNG") {
  TempDir d;
  GptConfig c;
  c.n_layer = 1;
  c.n_embd = 8;
  c.n_head = 2;
  c.block_size = 4;
  c.vocab_size = 10;
  c.batch = 1;
  c.seq_len = 4;
  Graph g = build_gpt2(c);
  append_backward(g);
  append_optimizer(g);
  auto plan = compile_plan(g, PlanOptions{});
  REQUIRE(plan.ok());
  CpuExecutor<float> a(*plan), b(*plan);
  a.init_parameters(1);
  const TensorId m = static_cast<TensorId>(plan->graph.tensors.size() - 1);  // some optimizer state
  for (auto& x : a.values(m)) x = 0.25f;
  REQUIRE(write_checkpoint(d.path.string(), a, {12, 345, 6789}).ok());
  auto s = load_checkpoint(checkpoint_path(d.path.string()), b);
  REQUIRE(s.ok());
  CHECK(s->step == 12);
  CHECK(s->data_position == 345);
  CHECK(s->rng_state == 6789u);
  for (auto p : plan->graph.params)
    CHECK(std::memcmp(a.data(p), b.data(p), plan->graph[p].bytes()) == 0);
  CHECK(b.values(m)[0] == 0.25f);
  CHECK_FALSE(fs::exists(checkpoint_path(d.path.string()) + ".tmp." + std::to_string(::getpid())));
}

TEST_CASE("TCP ring all-reduce: 3 ranks get identical sums") {
  const int world = 3, base = 23000 + static_cast<int>(::getpid() % 9000);
  std::vector<std::vector<float>> data(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    data[static_cast<std::size_t>(r)].resize(1001);
    for (std::size_t i = 0; i < 1001; ++i)
      data[static_cast<std::size_t>(r)][i] =
          static_cast<float>(r + 1) * 0.5f + static_cast<float>(i);
    ranks.emplace_back([&, r] {
      auto comm = connect_tcp_ring(r, world, "127.0.0.1", base, 10000);
      if (!comm) {
        errors[static_cast<std::size_t>(r)] = comm.error().message;
        return;
      }
      if (auto s = (*comm)->all_reduce_sum(std::span<float>(data[static_cast<std::size_t>(r)])); !s)
        errors[static_cast<std::size_t>(r)] = s.error().message;
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) REQUIRE(e.empty());
  for (std::size_t i = 0; i < 1001; ++i) {
    CHECK(data[0][i] == Approx(3.0 + 3.0 * static_cast<double>(i)));
    CHECK(data[0][i] == data[1][i]);
    CHECK(data[1][i] == data[2][i]);
  }
}

namespace {
// Stands in for the CUDA backend's loop: records the plan it was handed.
bool g_gpu_trainer_called = false;
DType g_grad_dtype = DType::i32, g_mean_dtype = DType::i32, g_act_dtype = DType::i32;
int fake_gpu_trainer(const WorkerConfig&, const Plan& plan, const Dataset&, std::ostream&,
                     std::ostream&) {
  g_gpu_trainer_called = true;
  const Graph& g = plan.graph;
  g_grad_dtype = g[g[g.params.front()].grad].dtype;
  for (const auto& t : g.tensors) {
    if (t.name == "h0.ln1_mean") g_mean_dtype = t.dtype;
    if (t.name == "h0.qkv") g_act_dtype = t.dtype;
  }
  return 0;
}
}  // namespace

TEST_CASE("worker: train.precision bf16 needs the CUDA backend; with one it gets the bf16 plan") {
  TempDir d;
  d.write("text.txt", std::string(4000, 'a') + "bcdefgh the quick brown fox\n");
  auto p = d.write("job.toml",
                   "[model]\nn_layer = 1\nn_embd = 16\nn_head = 2\nblock_size = 8\n[data]\n"
                   "path = \"" +
                       (d.path / "text.txt").string() +
                       "\"\n[train]\nbatch = 2\nseq_len = 8\nsteps = 1\nprecision = \"bf16\"\n");
  WorkerOptions o;
  o.config_path = p.string();
  std::ostringstream out, err;
  CHECK(run_worker(o, out, err) == 2);
  CHECK_THAT(err.str(), Catch::Contains("train.precision: \"bf16\" needs the CUDA backend"));
  CHECK_THAT(err.str(), Catch::Contains("-Dcuda=enabled"));
  o.gpu_trainer = &fake_gpu_trainer;
  std::ostringstream out2, err2;
  CHECK(run_worker(o, out2, err2) == 0);
  CHECK(g_gpu_trainer_called);
  CHECK(g_grad_dtype == DType::f32);  // fp32 parameter gradients
  CHECK(g_mean_dtype == DType::f32);  // fp32 LayerNorm statistics
  CHECK(g_act_dtype == DType::bf16);  // bf16 activations
}

TEST_CASE("graph: Precision::cuda_bf16 types what the CUDA kernels take; fp32 graphs unchanged") {
  GptConfig c;
  c.n_layer = 1;
  Graph cuda = build_gpt2(c, Precision::cuda_bf16());
  append_backward(cuda);
  append_optimizer(cuda);
  Graph cpu = build_gpt2(c);
  append_backward(cpu);
  append_optimizer(cpu);
  std::map<std::string, DType> cpu_dtype;
  for (const auto& t : cpu.tensors) cpu_dtype[t.name] = t.dtype;
  int masters = 0;
  for (const Tensor& t : cuda.tensors) {
    INFO(t.name);
    if (t.name.ends_with(".master")) {
      ++masters;  // only bf16 parameters keep an fp32 master copy
      CHECK(t.dtype == DType::f32);
      continue;
    }
    REQUIRE(cpu_dtype.count(t.name) == 1);
    CHECK(cpu_dtype[t.name] == (t.dtype == DType::i32 ? DType::i32 : DType::f32));
    const bool stat = t.name.ends_with("_mean") || t.name.ends_with("_rstd") ||
                      t.name.ends_with("_lse") || t.name.find("scratch") != std::string::npos ||
                      t.name == "losses";
    if (t.role == Role::gradient || t.role == Role::optimizer_state || stat || t.name == "scalars")
      CHECK(t.dtype == DType::f32);
    else if (t.role == Role::parameter || t.role == Role::activation)
      CHECK(t.dtype == DType::bf16);
  }
  CHECK(masters == static_cast<int>(cuda.params.size()));
  CHECK(cuda.tensors.size() == cpu.tensors.size() + cuda.params.size());
}
