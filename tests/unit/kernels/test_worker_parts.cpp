// The worker's pure parts: data decoding (janeaustenr, llm.c tokens, text checks), checkpoints
// round trip, the TCP ring all-reduce with ranks as threads, and the bf16 hand-over.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "../temp_dir.hpp"
#include "catch.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/host_communicators.hpp"
#include "topolaunch/kernels/plan.hpp"
#include "topolaunch/kernels/worker.hpp"

using namespace topolaunch::kernels;
namespace fs = std::filesystem;

using topolaunch::testing::TempDir;

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
  REQUIRE(write_checkpoint(d.path.string(), a, {12, 345, 6789}, 2).ok());
  auto s = load_checkpoint(checkpoint_path(d.path.string(), 12), b);
  REQUIRE(s.ok());
  CHECK(s->step == 12);
  CHECK(s->data_position == 345);
  CHECK(s->rng_state == 6789u);
  for (auto p : plan->graph.params)
    CHECK(std::memcmp(a.data(p), b.data(p), plan->graph[p].bytes()) == 0);
  CHECK(b.values(m)[0] == 0.25f);
  CHECK(fs::exists(checkpoint_path(d.path.string(), 12)));
  CHECK(std::distance(fs::directory_iterator(d.path), fs::directory_iterator{}) ==
        1);  // no temporary
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

TEST_CASE(
    "TCP ring, 4 ranks: reduce-scatter leaves each rank its segment's sum, bit-equal to the "
    "all-reduce's; all-gather spreads the segments") {
  const int world = 4, base = 23000 + static_cast<int>((::getpid() + 4000) % 9000);
  const std::size_t n = 1000;  // segments of 250
  // Values whose sums round differently in different orders, so that the order is checked.
  auto value = [](int r, std::size_t i) {
    return 1.0f / static_cast<float>(3 + r) + 1e-3f * static_cast<float>(i % 11) * (r % 2 ? 1 : -1);
  };
  std::vector<std::vector<float>> reduced(world), scattered(world), gathered(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    auto& a = reduced[static_cast<std::size_t>(r)];
    auto& b = scattered[static_cast<std::size_t>(r)];
    auto& c = gathered[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < n; ++i) a.push_back(value(r, i));
    b = a;
    c.assign(n, -1.0f);
    for (std::size_t i = segment_begin(n, world, r); i < segment_begin(n, world, r + 1); ++i)
      c[i] = static_cast<float>(r);
    ranks.emplace_back([&, r] {
      auto comm = connect_tcp_ring(r, world, "127.0.0.1", base, 10000);
      std::string& e = errors[static_cast<std::size_t>(r)];
      if (!comm) {
        e = comm.error().message;
        return;
      }
      if (auto s = (*comm)->all_reduce_sum(std::span<float>(a)); !s) e = s.error().message;
      if (auto s = (*comm)->reduce_scatter_sum(std::span<float>(b)); !s) e = s.error().message;
      if (auto s = (*comm)->all_gather(std::span<float>(c)); !s) e = s.error().message;
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) REQUIRE(e.empty());
  for (int r = 0; r < world; ++r) {
    const auto& a = reduced[static_cast<std::size_t>(r)];
    const auto& b = scattered[static_cast<std::size_t>(r)];
    const auto& c = gathered[static_cast<std::size_t>(r)];
    REQUIRE(a == reduced[0]);
    for (std::size_t i = segment_begin(n, world, r); i < segment_begin(n, world, r + 1); ++i)
      REQUIRE(b[i] == a[i]);
    for (int q = 0; q < world; ++q)
      for (std::size_t i = segment_begin(n, world, q); i < segment_begin(n, world, q + 1); ++i)
        REQUIRE(c[i] == static_cast<float>(q));
  }
  double exact = 0;
  for (int r = 0; r < world; ++r) exact += static_cast<double>(value(r, 5));
  CHECK(reduced[0][5] == Approx(exact).epsilon(1e-6));
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
