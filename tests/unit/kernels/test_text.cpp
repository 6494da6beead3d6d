// From raw text to a model you can use: token files with their vocabulary, SentencePiece training
// and encoding (any thread count, the same tokens), the KV-cache decoder against the training
// graph's forward, the sampler, and safetensors export/import (the same parameters and loss).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "../temp_dir.hpp"
#include "catch.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/cpu_backend.hpp"
#include "topolaunch/kernels/cpu_decoder.hpp"
#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/interchange.hpp"
#include "topolaunch/kernels/plan.hpp"
#include "topolaunch/kernels/prepare.hpp"
#include "topolaunch/kernels/sampling.hpp"
#include "topolaunch/kernels/tokenizer.hpp"

using namespace topolaunch::kernels;
namespace fs = std::filesystem;
using topolaunch::testing::TempDir;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void require_sentencepiece() {
  if (!have_sentencepiece())
    FAIL(
        "this build has no SentencePiece (apt-get install libsentencepiece-dev; meson "
        "-Dsentencepiece=enabled)");
}

// A small corpus of real text: the first lines of Jane Austen (Debian's r-cran-janeaustenr).
std::string austen(std::size_t bytes) {
  auto text = decode_r_lazyload_text(topolaunch::jobspec::kJaneAustenRdb);
  if (!text.ok()) FAIL("r-cran-janeaustenr is not installed: " << text.error().message);
  std::string t = text->substr(0, bytes);
  return t.substr(0, t.rfind('\n') + 1);
}

GptConfig tiny_gpt() {
  GptConfig c;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 2;
  c.block_size = 12;
  c.vocab_size = 50;  // padded to 64
  c.batch = 1;
  c.seq_len = 12;
  return c;
}

Plan training_plan(const GptConfig& c) {
  Graph g = build_gpt2(c);
  append_backward(g);
  append_optimizer(g);
  auto plan = compile_plan(std::move(g), PlanOptions{});
  REQUIRE(plan.ok());
  return std::move(*plan);
}

NamedWeights weights_of(CpuExecutor<float>& ex) {
  NamedWeights w;
  for (TensorId p : ex.plan().graph.params) {
    auto v = ex.values(p);
    w[ex.plan().graph[p].name].assign(v.begin(), v.end());
  }
  return w;
}

}  // namespace

TEST_CASE("token files: the vocabulary travels in header[3]; llm.c's (0 there) are GPT-2's") {
  TempDir d;
  const std::string path = (d.path / "t.bin").string();
  auto w = TokenFileWriter::create(path, 300);
  REQUIRE(w.ok());
  REQUIRE(w->append(std::vector<std::int32_t>{1, 299, 7}).ok());
  REQUIRE(w->append(std::vector<std::int32_t>{0}).ok());
  REQUIRE(w->finish().ok());
  CHECK_FALSE(fs::exists(path + ".tmp"));
  auto r = load_token_file(path);
  REQUIRE(r.ok());
  CHECK(r->tokens == std::vector<std::int32_t>{1, 299, 7, 0});
  CHECK(r->vocab_size == 300);

  // A token at or above the file's vocabulary is refused, naming the file and the key.
  std::string bytes = slurp(path);
  bytes[1024 + 2] = 44, bytes[1024 + 3] = 1;  // 300
  auto bad = load_token_file(d.write("bad.bin", bytes).string(), "data.val_path");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message, Catch::StartsWith("data.val_path: ") &&
                                      Catch::Contains("bad.bin") && Catch::Contains("token 300"));
  // header[3] = 0: GPT-2's vocabulary.
  std::memset(bytes.data() + 12, 0, 4);
  auto gpt2 = load_token_file(d.write("gpt2.bin", bytes).string());
  REQUIRE(gpt2.ok());
  CHECK(gpt2->vocab_size == 50257);
  // Above uint16: refused when written and when read.
  CHECK_FALSE(TokenFileWriter::create((d.path / "big.bin").string(), 65536).ok());
  const std::int32_t huge = 70000;
  std::memcpy(bytes.data() + 12, &huge, 4);
  auto big = load_token_file(d.write("big.bin", bytes).string());
  REQUIRE_FALSE(big.ok());
  CHECK_THAT(big.error().message, Catch::Contains("vocabulary of 70000"));
}

TEST_CASE("SentencePiece BPE: trained lines decode back; any thread count gives the same tokens") {
  require_sentencepiece();
  TempDir d;
  const std::string text = austen(200'000);
  std::vector<std::string_view> lines;
  for (std::string_view rest = text; !rest.empty();) {
    const auto nl = rest.find('\n');
    lines.push_back(rest.substr(0, nl));
    rest.remove_prefix(nl + 1);
  }
  TokenizerTraining o;
  o.vocab_size = 300;
  auto t = Tokenizer::train(lines, o, (d.path / "m.model").string());
  REQUIRE(t.ok());
  CHECK(t->vocab_size() == 300);
  REQUIRE(t->newline_id() >= 0);
  const std::string sample = "It is a truth universally acknowledged,\nthat a single man\n";
  std::vector<std::int32_t> ids;
  t->encode(sample, ids);
  CHECK(std::count(ids.begin(), ids.end(), t->newline_id()) == 2);
  CHECK(t->decode(ids) == sample);
  CHECK(encode_parallel(*t, text, 1) == encode_parallel(*t, text, 3));
  // The model file is what load reads.
  auto loaded = Tokenizer::load((d.path / "m.model").string());
  REQUIRE(loaded.ok());
  std::vector<std::int32_t> again;
  loaded->encode(sample, again);
  CHECK(again == ids);
  // A corrupt model is refused with one line naming the file and the key.
  auto corrupt =
      Tokenizer::load(d.write("bad.model", "not a protobuf at all").string(), "data.tokenizer");
  REQUIRE_FALSE(corrupt.ok());
  CHECK_THAT(corrupt.error().message,
             Catch::StartsWith("data.tokenizer: ") && Catch::Contains("bad.model"));
  CHECK(corrupt.error().exit_code == 2);
}

TEST_CASE("data prepare: tokenizer, train and val files; the same bytes on 1 and 2 threads") {
  require_sentencepiece();
  TempDir d;
  const fs::path corpus = d.write("corpus.txt", austen(400'000));
  PrepareOptions o;
  o.corpus = corpus.string();
  o.training.vocab_size = 256;
  o.val_fraction = 0.1;
  std::ostringstream log;
  o.out_dir = (d.path / "one").string();
  o.threads = 1;
  auto one = prepare_data(o, log);
  REQUIRE(one.ok());
  o.out_dir = (d.path / "two").string();
  o.threads = 2;
  o.tokenizer = one->tokenizer_path;  // the same model: encoding alone is compared
  auto two = prepare_data(o, log);
  REQUIRE(two.ok());
  CHECK(slurp(one->train_path) == slurp(two->train_path));
  CHECK(slurp(one->val_path) == slurp(two->val_path));
  auto train = load_token_file(one->train_path);
  auto val = load_token_file(one->val_path);
  REQUIRE(train.ok());
  REQUIRE(val.ok());
  CHECK(train->vocab_size == 256);
  const double share = static_cast<double>(val->tokens.size()) /
                       static_cast<double>(val->tokens.size() + train->tokens.size());
  CHECK(share > 0.07);
  CHECK(share < 0.13);
  // An empty corpus: one line naming it.
  o.corpus = d.write("empty.txt", "").string();
  o.tokenizer.clear();
  auto empty = prepare_data(o, log);
  REQUIRE_FALSE(empty.ok());
  CHECK_THAT(empty.error().message, Catch::Contains("empty.txt") && Catch::Contains("empty"));
}

TEST_CASE("KV-cache decoder: each position's logits are the training forward's") {
  const GptConfig c = tiny_gpt();
  Plan plan = training_plan(c);
  CpuExecutor<float> ex(plan);
  ex.init_parameters(7);
  const Graph& g = ex.plan().graph;
  std::vector<std::int32_t> tokens{3, 17, 42, 0, 49, 5, 5, 21, 8, 13, 30, 2};
  std::copy(tokens.begin(), tokens.end(), ex.ints(g.tokens));
  std::fill_n(ex.ints(g.targets), tokens.size(), 0);
  REQUIRE(ex.run_forward().ok());
  TensorId logits = kNoTensor;
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors.size()); ++t)
    if (g[t].name == "logits") logits = t;
  REQUIRE(logits != kNoTensor);
  const std::vector<float> reference(ex.values(logits).begin(), ex.values(logits).end());
  auto decoder = CpuDecoder::create(c, weights_of(ex));
  REQUIRE(decoder.ok());
  const std::size_t Vp = 64;
  double worst = 0;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    auto l = decoder->step(tokens[t]);
    REQUIRE(l.size() == 50);
    for (std::size_t v = 0; v < 50; ++v)
      worst = std::max(worst, std::abs(double(l[v]) - reference[t * Vp + v]));
  }
  CHECK(worst < 1e-5);
  CHECK(decoder->position() == 12);
}

TEST_CASE("sampler: temperature 0 is the argmax, top-k 1 too, and a seed repeats itself") {
  const std::vector<float> logits{0.1f, 2.0f, -1.0f, 1.9f, 2.0f};
  std::mt19937_64 rng(1);
  SamplingOptions o;
  o.temperature = 0;
  CHECK(sample_token(logits, o, rng) == 1);  // ties: the lower id
  o.temperature = 1.0;
  o.top_k = 1;
  CHECK(sample_token(logits, o, rng) == 1);
  o.top_k = 3;
  std::mt19937_64 a(99), b(99);
  std::vector<std::int32_t> x, y;
  for (int i = 0; i < 50; ++i) {
    x.push_back(sample_token(logits, o, a));
    y.push_back(sample_token(logits, o, b));
  }
  CHECK(x == y);
  for (auto t : x) CHECK((t == 1 || t == 3 || t == 4));
}

TEST_CASE(
    "safetensors: export then import gives the same parameters and the same loss, bit for bit") {
  TempDir d;
  const GptConfig c = tiny_gpt();
  Plan plan = training_plan(c);
  CpuExecutor<float> a(plan);
  a.init_parameters(11);
  const NamedWeights w = weights_of(a);
  REQUIRE(export_hf_gpt2((d.path / "hf").string(), c, w, "").ok());
  auto tensors = read_safetensors((d.path / "hf" / "model.safetensors").string());
  REQUIRE(tensors.ok());
  CHECK(tensors->size() == 4 + 12 * 2);
  CHECK((*tensors)[0].name == "wte.weight");
  CHECK((*tensors)[0].shape == std::vector<std::int64_t>{50, 16});  // padded rows dropped
  auto imported = from_hf_gpt2((d.path / "hf").string(), c);
  REQUIRE(imported.ok());
  CpuExecutor<float> b(plan);
  b.init_parameters(12);  // other values, overwritten by the import
  REQUIRE(
      load_initial_weights((d.path / "hf").string(), c, b.plan().graph, write_to_executor(b)).ok());
  for (const auto& [name, values] : w) {
    std::vector<float> got;
    for (TensorId p : b.plan().graph.params)
      if (b.plan().graph[p].name == name) got.assign(b.values(p).begin(), b.values(p).end());
    if (name == "wte") got.resize(64 * 16), std::fill(got.begin() + 50 * 16, got.end(), 0.0f);
    std::vector<float> want = values;
    if (name == "wte") std::fill(want.begin() + 50 * 16, want.end(), 0.0f);
    CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
  }
  const Graph& g = plan.graph;
  for (auto* ex : {&a, &b}) {
    for (int i = 0; i < 12; ++i)
      ex->ints(g.tokens)[i] = (i * 7) % 50, ex->ints(g.targets)[i] = (i * 3) % 50;
    REQUIRE(ex->run_forward().ok());
  }
  CHECK(a.mean_loss() == b.mean_loss());
}

TEST_CASE("safetensors: a truncated header and a tensor of the wrong shape are refused by name") {
  TempDir d;
  const GptConfig c = tiny_gpt();
  Plan plan = training_plan(c);
  CpuExecutor<float> a(plan);
  a.init_parameters(3);
  REQUIRE(export_hf_gpt2((d.path / "hf").string(), c, weights_of(a), "").ok());
  const std::string file = (d.path / "hf" / "model.safetensors").string();
  const std::string bytes = slurp(file);
  auto cut = read_safetensors(d.write("cut.safetensors", bytes.substr(0, 100)).string());
  REQUIRE_FALSE(cut.ok());
  CHECK_THAT(cut.error().message,
             Catch::Contains("cut.safetensors") && Catch::Contains("truncated safetensors header"));
  auto tiny = read_safetensors(d.write("tiny.safetensors", bytes.substr(0, 5)).string());
  REQUIRE_FALSE(tiny.ok());
  // The same file read by a model of another width: the tensor and both shapes are named.
  GptConfig wider = c;
  wider.n_embd = 32;
  fs::remove(d.path / "hf" / "config.json");
  auto wrong = from_hf_gpt2((d.path / "hf").string(), wider);
  REQUIRE_FALSE(wrong.ok());
  CHECK_THAT(wrong.error().message, Catch::Contains("tensor wte.weight has shape [50, 16]") &&
                                        Catch::Contains("[50, 32]"));
  CHECK(wrong.error().exit_code == 2);
}

TEST_CASE("generate: past the model's context the window slides; a seed gives the same tokens") {
  const GptConfig c = tiny_gpt();  // block_size 12
  Plan plan = training_plan(c);
  CpuExecutor<float> ex(plan);
  ex.init_parameters(5);
  SamplingOptions o;
  o.tokens = 40;
  o.seed = 9;
  std::vector<std::vector<std::int32_t>> runs;
  for (int run = 0; run < 2; ++run) {
    auto d = create_cpu_decoder(c, weights_of(ex));
    REQUIRE(d.ok());
    const std::vector<std::int32_t> prompt{1, 2, 3};
    auto out = generate(**d, prompt, o, c.block_size);
    REQUIRE(out.ok());
    CHECK(out->size() == 40);
    CHECK((*d)->position() <= c.block_size);
    for (auto t : *out) CHECK((t >= 0 && t < 50));
    runs.push_back(*out);
  }
  CHECK(runs[0] == runs[1]);
}
