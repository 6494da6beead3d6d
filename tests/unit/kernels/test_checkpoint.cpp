// The backend-neutral checkpoint view (checkpoint_layout): the CPU worker's fp32 graph and the
// CUDA worker's bf16 graph (fp32 master copies) save the same named fp32 tensors, so a checkpoint
// of one loads in the other; the CPU layout is the one the CPU worker always wrote (old files
// load).
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "catch.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/plan.hpp"

using namespace topolaunch::kernels;
using topolaunch::make_error;
using topolaunch::ok_status;
using topolaunch::Status;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tl-ckpt-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

GptConfig tiny_gpt() {
  GptConfig c;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 2;
  c.block_size = 8;
  c.vocab_size = 20;
  c.batch = 2;
  c.seq_len = 8;
  return c;
}

Graph training_graph(Precision precision) {
  Graph g = build_gpt2(tiny_gpt(), precision);
  append_backward(g);
  append_optimizer(g);
  return g;
}

// The fingerprint the CPU worker wrote before the neutral view: every parameter, then every
// optimizer-state tensor in graph order, each with its dtype.
std::uint64_t legacy_cpu_fingerprint(const Graph& g) {
  std::vector<TensorId> ids(g.params.begin(), g.params.end());
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors.size()); ++t)
    if (g[t].role == Role::optimizer_state) ids.push_back(t);
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
  };
  for (auto t : ids) {
    mix(g[t].name);
    for (auto d : g[t].shape) mix(":" + std::to_string(d));
    mix(std::string(dtype_name(g[t].dtype)) + ";");
  }
  return h;
}

// A stand-in backend: values by tensor name.
using Store = std::map<std::string, std::vector<float>>;
ReadCheckpointTensor read_from(const Store& store) {
  return [&store](const CheckpointEntry& e, std::span<float> out) -> Status {
    const auto& v = store.at(e.name);
    if (v.size() != out.size()) return make_error("size mismatch for " + e.name, 1);
    std::memcpy(out.data(), v.data(), e.bytes());
    return ok_status();
  };
}
WriteCheckpointTensor write_to(Store& store) {
  return [&store](const CheckpointEntry& e, std::span<const float> values) -> Status {
    store[e.name].assign(values.begin(), values.end());
    return ok_status();
  };
}

}  // namespace

TEST_CASE(
    "checkpoint layout: the bf16 (CUDA) graph saves the same named fp32 tensors as the CPU "
    "graph, no master copies, and the CPU layout is the one old CPU checkpoints have") {
  const Graph cpu = training_graph(Precision{});
  const Graph gpu = training_graph(Precision::cuda_bf16());
  const auto a = checkpoint_layout(cpu);
  const auto b = checkpoint_layout(gpu);
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == 3 * cpu.params.size() + 1);  // params, grad_norm, m and v of each
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].name == b[i].name);
    CHECK(a[i].shape == b[i].shape);
    CHECK(a[i].kind == b[i].kind);
    CHECK(b[i].name.find(".master") == std::string::npos);
    if (b[i].kind == CheckpointEntry::Kind::parameter)
      CHECK(gpu[b[i].tensor].dtype == DType::bf16);  // read through its fp32 master copy
    else
      CHECK(gpu[b[i].tensor].dtype == DType::f32);
  }
  CHECK(model_fingerprint(cpu) == model_fingerprint(gpu));
  CHECK(model_fingerprint(cpu) == legacy_cpu_fingerprint(cpu));
  // A different model is a different fingerprint.
  GptConfig wider = tiny_gpt();
  wider.n_embd = 32;
  Graph other = build_gpt2(wider);
  append_backward(other);
  append_optimizer(other);
  CHECK(model_fingerprint(other) != model_fingerprint(cpu));
}

TEST_CASE(
    "checkpoint: a CPU executor's checkpoint loads through the neutral view of the bf16 "
    "graph bit for bit, and the neutral writer's file loads in a CPU executor") {
  TempDir d;
  auto plan = compile_plan(training_graph(Precision{}), PlanOptions{});
  REQUIRE(plan.ok());
  CpuExecutor<float> cpu(*plan);
  cpu.init_parameters(7);
  const Graph& g = plan->graph;
  const auto cpu_layout = checkpoint_layout(g);
  float fill = 0.5f;
  for (const auto& e : cpu_layout)
    if (e.kind == CheckpointEntry::Kind::optimizer_state)
      for (auto& x : cpu.values(e.tensor)) x = (fill += 0.001f);
  REQUIRE(write_checkpoint(d.path.string(), cpu, {9, 4096, 77}).ok());

  // CPU -> "GPU": the bf16 graph reads the same values under the same names.
  const Graph gpu = training_graph(Precision::cuda_bf16());
  Store restored;
  auto s = load_checkpoint(checkpoint_path(d.path.string()), gpu, write_to(restored));
  REQUIRE(s.ok());
  CHECK(s->step == 9);
  CHECK(s->data_position == 4096);
  CHECK(s->rng_state == 77u);
  REQUIRE(restored.size() == cpu_layout.size());
  for (const auto& e : cpu_layout) {
    const auto& v = restored.at(e.name);
    REQUIRE(v.size() == e.elements);
    CHECK(std::memcmp(v.data(), cpu.data(e.tensor), e.bytes()) == 0);
  }

  // "GPU" -> CPU: the neutral writer (what the CUDA worker calls) from the bf16 graph, loaded by a
  // fresh CPU executor.
  for (auto& [name, v] : restored)
    for (auto& x : v) x *= 2.0f;
  TempDir d2;
  REQUIRE(write_checkpoint(d2.path.string(), gpu, read_from(restored), {10, 8192, 78}).ok());
  CpuExecutor<float> back(*plan);
  auto s2 = load_checkpoint(checkpoint_path(d2.path.string()), back);
  REQUIRE(s2.ok());
  CHECK(s2->step == 10);
  for (const auto& e : cpu_layout)
    CHECK(std::memcmp(back.data(e.tensor), restored.at(e.name).data(), e.bytes()) == 0);
  CHECK_FALSE(fs::exists(checkpoint_path(d2.path.string()) + ".tmp." + std::to_string(::getpid())));
}

TEST_CASE(
    "checkpoint (neutral view): truncated, corrupt or another model's file is refused "
    "before any tensor is written") {
  TempDir d;
  const Graph g = training_graph(Precision::cuda_bf16());
  Store store;
  float x = 0;
  for (const auto& e : checkpoint_layout(g)) {
    auto& v = store[e.name];
    v.resize(e.elements);
    for (auto& f : v) f = (x += 0.01f);
  }
  REQUIRE(write_checkpoint(d.path.string(), g, read_from(store), {3, 0, 0}).ok());
  const std::string path = checkpoint_path(d.path.string());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  int writes = 0;
  auto counting = [&](const CheckpointEntry&, std::span<const float>) -> Status {
    ++writes;
    return ok_status();
  };
  auto rewrite = [&](const std::string& text) { std::ofstream(path, std::ios::binary) << text; };

  rewrite(bytes.substr(0, bytes.size() - 100));
  auto t = load_checkpoint(path, g, counting);
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().exit_code == 2);
  CHECK_THAT(t.error().message, Catch::Contains("truncated"));

  std::string corrupt = bytes;
  corrupt[200] ^= 0x5a;
  rewrite(corrupt);
  t = load_checkpoint(path, g, counting);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.error().message, Catch::Contains("checksum"));

  rewrite(bytes);
  GptConfig wider = tiny_gpt();
  wider.n_embd = 32;
  Graph other = build_gpt2(wider, Precision::cuda_bf16());
  append_backward(other);
  append_optimizer(other);
  t = load_checkpoint(path, other, counting);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.error().message, Catch::Contains("different model"));
  CHECK(writes == 0);

  t = load_checkpoint(path, g, counting);  // the intact file loads
  REQUIRE(t.ok());
  CHECK(writes == static_cast<int>(checkpoint_layout(g).size()));
}
