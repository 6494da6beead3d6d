// The worker's pure parts: config parsing errors, data decoding (janeaustenr, llm.c tokens, text
// checks), checkpoints round trip, and the TCP ring all-reduce with ranks as threads.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "catch.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/communicator.hpp"
#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/job.hpp"

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
