// Checkpoints: the backend-neutral view (checkpoint_layout: the CPU worker's fp32 graph and the
// CUDA worker's bf16 graph save the same named fp32 tensors, so a checkpoint of one loads in the
// other); the file format and its refusals; generations, pruning and resume; format 1; files
// past 4 GiB; the asynchronous writer.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
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

namespace {

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A store with distinct values in every entry of g's layout (`salt` makes generations differ).
Store filled_store(const Graph& g, float salt) {
  Store store;
  float x = salt;
  for (const auto& e : checkpoint_layout(g)) {
    auto& v = store[e.name];
    v.resize(e.elements);
    for (auto& f : v) f = (x += 0.01f);
  }
  return store;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Writes generations `steps` of dir from g, each with its own values.
void write_generations(const fs::path& dir, const Graph& g, std::vector<std::int64_t> steps,
                       int keep, std::map<std::int64_t, Store>& stores) {
  for (auto step : steps) {
    stores[step] = filled_store(g, static_cast<float>(step));
    REQUIRE(write_checkpoint(dir.string(), g, read_from(stores[step]), {step, step * 10, 7}, keep)
                .ok());
  }
}

// Format 1 (before generations): the same header and payload, magic TLCKPT01, trailer
// u32 crc32 | "TLCKEND!".
std::string as_format_1(const std::string& v2) {
  std::string body = v2.substr(0, v2.size() - 16);
  body.replace(0, 8, "TLCKPT01");
  const auto crc = static_cast<std::uint32_t>(crc32(crc32(0L, Z_NULL, 0),
                                                    reinterpret_cast<const Bytef*>(body.data()),
                                                    static_cast<uInt>(body.size())));
  return body + std::string(reinterpret_cast<const char*>(&crc), 4) + "TLCKEND!";
}

// Runs fn in a child process; its exit status, or -1 when it has not ended after timeout_s (a
// hang: the child is killed).
int exit_status_in_child(const std::function<int()>& fn, int timeout_s) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(fn());
  for (int i = 0; i < timeout_s * 100; ++i) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

}  // namespace

TEST_CASE("crc64: the CRC-64/XZ check value, and pieces continue one another") {
  const std::string check = "123456789";
  CHECK(crc64(std::as_bytes(std::span(check.data(), check.size()))) == 0x995DC9BBDF1939FAull);
  CHECK(crc64({}) == 0);
  std::vector<std::byte> bytes(1000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 131 % 251);
  const std::uint64_t whole = crc64(bytes);
  for (std::size_t cut : {0, 1, 7, 8, 9, 500, 999}) {
    const auto a = std::span(bytes).first(cut), b = std::span(bytes).subspan(cut);
    CHECK(crc64(b, crc64(a)) == whole);
  }
  bytes[500] ^= std::byte{1};
  CHECK(crc64(bytes) != whole);
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
  auto written = write_checkpoint(d.path.string(), cpu, {9, 4096, 77}, 2);
  REQUIRE(written.ok());
  CHECK(*written == checkpoint_path(d.path.string(), 9));
  CHECK(fs::path(*written).filename() == "checkpoint-000000000009.bin");

  // CPU -> "GPU": the bf16 graph reads the same values under the same names.
  const Graph gpu = training_graph(Precision::cuda_bf16());
  Store restored;
  auto s = load_checkpoint(*written, gpu, write_to(restored));
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

  // "GPU" -> CPU: the neutral writer (what the CUDA worker calls) from the bf16 graph, resumed by
  // a fresh CPU executor.
  for (auto& [name, v] : restored)
    for (auto& x : v) x *= 2.0f;
  TempDir d2;
  REQUIRE(write_checkpoint(d2.path.string(), gpu, read_from(restored), {10, 8192, 78}, 2).ok());
  CpuExecutor<float> back(*plan);
  auto s2 = resume_from_newest(d2.path.string(), back);
  REQUIRE(s2.ok());
  REQUIRE(s2->has_value());
  CHECK((*s2)->state.step == 10);
  CHECK((*s2)->skipped.empty());
  for (const auto& e : cpu_layout)
    CHECK(std::memcmp(back.data(e.tensor), restored.at(e.name).data(), e.bytes()) == 0);
  CHECK(names_in(d2.path) == std::vector<std::string>{"checkpoint-000000000010.bin"});
}

TEST_CASE(
    "checkpoint (one file): truncated, bit-flipped, wrong-size or another model's file is "
    "refused before any tensor is written") {
  TempDir d;
  const Graph g = training_graph(Precision::cuda_bf16());
  const Store store = filled_store(g, 0);
  auto written = write_checkpoint(d.path.string(), g, read_from(store), {3, 0, 0}, 2);
  REQUIRE(written.ok());
  const std::string path = *written;
  const std::string bytes = read_bytes(path);
  int writes = 0;
  auto counting = [&](const CheckpointEntry&, std::span<const float>) -> Status {
    ++writes;
    return ok_status();
  };

  write_bytes(path, bytes.substr(0, bytes.size() - 100));
  auto t = load_checkpoint(path, g, counting);
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().exit_code == 2);
  CHECK_THAT(t.error().message,
             Catch::Contains("is truncated (" + std::to_string(bytes.size() - 100) + " bytes"));

  write_bytes(path, bytes.substr(0, 20));
  t = load_checkpoint(path, g, counting);
  CHECK_THAT(t.error().message, Catch::Contains("truncated before its header"));

  write_bytes(path, bytes + "x");
  t = load_checkpoint(path, g, counting);
  CHECK_THAT(t.error().message, Catch::Contains("has the wrong size"));

  // One bit anywhere: in the header, a tensor, the stored checksum itself.
  for (std::size_t at : {std::size_t{30}, std::size_t{200}, bytes.size() / 2, bytes.size() - 12}) {
    std::string flipped = bytes;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x01);
    write_bytes(path, flipped);
    t = load_checkpoint(path, g, counting);
    REQUIRE_FALSE(t.ok());
    CHECK_THAT(t.error().message, Catch::Contains("fails its checksum"));
  }

  std::string unterminated = bytes;
  unterminated[bytes.size() - 1] = '?';
  write_bytes(path, unterminated);
  CHECK_THAT(load_checkpoint(path, g, counting).error().message, Catch::Contains("no end marker"));

  write_bytes(path, bytes);
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

TEST_CASE(
    "generations: the newest keep are kept, each renamed into place whole; a failed write leaves "
    "no temporary and the older generations as they were") {
  TempDir d;
  const Graph g = training_graph(Precision{});
  std::map<std::int64_t, Store> stores;
  write_generations(d.path, g, {50, 100, 150, 200}, 3, stores);
  CHECK(names_in(d.path) == std::vector<std::string>{"checkpoint-000000000100.bin",
                                                     "checkpoint-000000000150.bin",
                                                     "checkpoint-000000000200.bin"});
  const auto listed = list_checkpoints(d.path.string());
  REQUIRE(listed.size() == 3);
  CHECK(listed[0].step == 200);
  CHECK(listed[2].step == 100);
  for (auto step : {100, 150, 200}) {
    Store back;
    auto s = load_checkpoint(checkpoint_path(d.path.string(), step), g, write_to(back));
    REQUIRE(s.ok());
    CHECK(s->step == step);
    CHECK(back == stores[step]);
  }

  // The backend fails half way through the payload: the file being written is removed, nothing
  // else changes.
  const auto before = names_in(d.path);
  const std::string newest = read_bytes(checkpoint_path(d.path.string(), 200));
  int reads = 0;
  auto failing = [&](const CheckpointEntry& e, std::span<float> out) -> Status {
    if (++reads == 5) return make_error("device lost", 1);
    return read_from(stores[200])(e, out);
  };
  auto w = write_checkpoint(d.path.string(), g, failing, {250, 0, 0}, 3);
  REQUIRE_FALSE(w.ok());
  CHECK(w.error().message == "device lost");
  CHECK(names_in(d.path) == before);
  CHECK(read_bytes(checkpoint_path(d.path.string(), 200)) == newest);

  // keep = 1 leaves only the one just written.
  write_generations(d.path, g, {300}, 1, stores);
  CHECK(names_in(d.path) == std::vector<std::string>{"checkpoint-000000000300.bin"});
}

TEST_CASE(
    "generations: a write prunes the generations newer than itself (a line a resume left) and "
    "temporaries of writers that were killed") {
  TempDir d;
  const Graph g = training_graph(Precision{});
  std::map<std::int64_t, Store> stores;
  write_generations(d.path, g, {100, 200, 300}, 3, stores);
  write_bytes(d.path / ".checkpoint-000000000400.bin.tmp.4242", "half a checkpoint");
  write_bytes(d.path / "notes.txt", "the user's");
  // A resume ignores the temporary and takes 300.
  Store back;
  auto r = resume_from_newest(d.path.string(), g, write_to(back));
  REQUIRE(r.ok());
  REQUIRE(r->has_value());
  CHECK((*r)->state.step == 300);
  // Resumed from 200 instead (say 300 was corrupt), the next write is 250: 300 goes.
  write_generations(d.path, g, {250}, 3, stores);
  CHECK(names_in(d.path) == std::vector<std::string>{"checkpoint-000000000100.bin",
                                                     "checkpoint-000000000200.bin",
                                                     "checkpoint-000000000250.bin", "notes.txt"});
}

TEST_CASE(
    "resume: the newest good generation; a bit-flipped, truncated, wrong-size or mislabelled "
    "newer one is skipped and named with why") {
  TempDir d;
  const Graph g = training_graph(Precision{});
  std::map<std::int64_t, Store> stores;
  write_generations(d.path, g, {100, 200, 300, 400, 500}, 5, stores);
  const std::string dir = d.path.string();
  auto at = [&](std::int64_t step) { return fs::path(checkpoint_path(dir, step)); };
  std::string flipped = read_bytes(at(500));
  flipped[flipped.size() / 3] = static_cast<char>(flipped[flipped.size() / 3] ^ 0x10);
  write_bytes(at(500), flipped);
  fs::resize_file(at(400), fs::file_size(at(400)) - 4096);
  write_bytes(at(300), read_bytes(at(300)) + std::string(64, '\0'));
  fs::rename(at(200), d.path / "checkpoint-000000000350.bin");  // holds step 200

  Store back;
  auto r = resume_from_newest(dir, g, write_to(back));
  REQUIRE(r.ok());
  REQUIRE(r->has_value());
  const ResumePoint& p = **r;
  CHECK(p.path == at(100).string());
  CHECK(p.state.step == 100);
  CHECK(p.state.data_position == 1000);
  CHECK(back == stores[100]);
  REQUIRE(p.skipped.size() == 4);
  CHECK(p.skipped[0] ==
        "checkpoint: skipped " + at(500).string() + ": fails its checksum (corrupt)");
  CHECK_THAT(p.skipped[1],
             Catch::StartsWith("checkpoint: skipped " + at(400).string() + ": is truncated ("));
  CHECK_THAT(p.skipped[2], Catch::Contains("checkpoint-000000000350.bin: holds step 200, its "
                                           "name says 350"));
  CHECK_THAT(p.skipped[3], Catch::StartsWith("checkpoint: skipped " + at(300).string() +
                                             ": has the wrong size ("));
}

TEST_CASE(
    "resume: a FIFO, a symlink to /dev/zero and a directory in a generation's place are skipped "
    "without being read: no hang, no memory growth") {
  TempDir d;
  const Graph g = training_graph(Precision{});
  std::map<std::int64_t, Store> stores;
  write_generations(d.path, g, {100}, 2, stores);
  const std::string dir = d.path.string();
  REQUIRE(::mkfifo(checkpoint_path(dir, 400).c_str(), 0600) == 0);
  fs::create_symlink("/dev/zero", checkpoint_path(dir, 300));
  fs::create_directory(checkpoint_path(dir, 200));
  // In a child: a regression that opens the FIFO blocks for ever, and one that reads /dev/zero
  // grows to the 4 GiB limit; both become a failed status instead of a stuck or killed test.
  // (Under AddressSanitizer, which reserves terabytes of shadow address space, there is no
  // RLIMIT_AS: the child's 20 s limit catches the growth instead.)
  const int status = exit_status_in_child(
      [&] {
#if !defined(__SANITIZE_ADDRESS__)
        struct rlimit limit {
          4ull << 30, 4ull << 30
        };
        ::setrlimit(RLIMIT_AS, &limit);
#endif
        Store back;
        auto r = resume_from_newest(dir, g, write_to(back));
        if (!r.ok() || !r->has_value() || (*r)->state.step != 100) return 3;
        const auto& skipped = (*r)->skipped;
        if (skipped.size() != 3) return 4;
        if (skipped[0].find("is not a regular file (a FIFO), not opened") == std::string::npos)
          return 5;
        if (skipped[1].find("is not a regular file (a character device)") == std::string::npos)
          return 6;
        if (skipped[2].find("is not a regular file (a directory)") == std::string::npos) return 7;
        return 0;
      },
      20);
  CHECK(status == 0);  // -1: hung; 3..7: which check failed
}

TEST_CASE(
    "resume: no checkpoint is a fresh start; none good is one line naming each file (exit 2); "
    "another model's newest stops the resume instead of falling back") {
  TempDir d;
  const Graph g = training_graph(Precision{});
  const std::string dir = d.path.string();
  Store back;
  auto none = resume_from_newest((d.path / "absent").string(), g, write_to(back));
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());

  std::map<std::int64_t, Store> stores;
  write_generations(d.path, g, {100, 200}, 2, stores);
  fs::resize_file(checkpoint_path(dir, 200), 10);
  write_bytes(checkpoint_path(dir, 100),
              "not a checkpoint at all, though long enough to hold a checkpoint header");
  auto bad = resume_from_newest(dir, g, write_to(back));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().exit_code == 2);
  CHECK(bad.error().message ==
        "checkpoint: no good checkpoint in " + dir +
            ": checkpoint-000000000200.bin is truncated before its header (10 bytes); "
            "checkpoint-000000000100.bin is not a topolaunch checkpoint (no TLCKPT01/TLCKPT02 "
            "magic) (set train.resume = false to start afresh)");
  CHECK(back.empty());

  // The newest is another model's: the folder is another job's, refused (not skipped).
  TempDir d2;
  write_generations(d2.path, g, {100}, 2, stores);
  GptConfig wider = tiny_gpt();
  wider.n_embd = 32;
  Graph other = build_gpt2(wider);
  append_backward(other);
  append_optimizer(other);
  Store others = filled_store(other, 1);
  REQUIRE(write_checkpoint(d2.path.string(), other, read_from(others), {200, 0, 0}, 5).ok());
  auto foreign = resume_from_newest(d2.path.string(), g, write_to(back));
  REQUIRE_FALSE(foreign.ok());
  CHECK(foreign.error().exit_code == 2);
  CHECK_THAT(foreign.error().message,
             Catch::Contains("checkpoint-000000000200.bin was written by a different model"));
  CHECK(back.empty());
}

TEST_CASE(
    "legacy: a format-1 checkpoint.bin (CRC-32) resumes, is taken after every generation, and is "
    "pruned as the oldest") {
  TempDir d;
  const Graph g = training_graph(Precision{});
  const std::string dir = d.path.string();
  std::map<std::int64_t, Store> stores;
  write_generations(d.path, g, {600}, 2, stores);
  const std::string v1 = as_format_1(read_bytes(checkpoint_path(dir, 600)));
  fs::remove(checkpoint_path(dir, 600));
  write_bytes(legacy_checkpoint_path(dir), v1);

  Store back;
  auto r = resume_from_newest(dir, g, write_to(back));
  REQUIRE(r.ok());
  REQUIRE(r->has_value());
  CHECK((*r)->path == legacy_checkpoint_path(dir));
  CHECK((*r)->state.step == 600);
  CHECK(back == stores[600]);

  std::string flipped = v1;
  flipped[100] = static_cast<char>(flipped[100] ^ 0x04);
  write_bytes(legacy_checkpoint_path(dir), flipped);
  CHECK_THAT(verify_checkpoint(legacy_checkpoint_path(dir), g).error().message,
             Catch::Contains("fails its checksum"));
  write_bytes(legacy_checkpoint_path(dir), v1);

  // Generations written after it come first; with keep = 2 the second one removes it.
  write_generations(d.path, g, {650}, 2, stores);
  CHECK(list_checkpoints(dir).back().path == legacy_checkpoint_path(dir));
  auto newer = resume_from_newest(dir, g, write_to(back));
  REQUIRE(newer.ok());
  CHECK((*newer)->state.step == 650);
  write_generations(d.path, g, {700}, 2, stores);
  CHECK(names_in(d.path) ==
        std::vector<std::string>{"checkpoint-000000000650.bin", "checkpoint-000000000700.bin"});
}

TEST_CASE(
    "a checkpoint past 4 GiB (a sparse file) verifies: its size and checksum are over all 64 "
    "bits of its length, a byte past 4 GiB included") {
  // An MLP whose parameters + AdamW state exceed 4 GiB; the graph alone, nothing allocated.
  MlpConfig c;
  c.vocab_size = 65536;
  c.n_embd = 2816;  // 4.5 GB: past 4 GiB by 240 MB
  c.hidden = {2816};
  Graph g = build_mlp(c);
  append_backward(g);
  append_optimizer(g);
  const auto layout = checkpoint_layout(g);
  std::uint64_t payload = 0;
  for (const auto& e : layout) payload += e.bytes();
  REQUIRE(payload > (std::uint64_t{1} << 32) + 4096);

  TempDir d;
  const std::string path = checkpoint_path(d.path.string(), 1);
  struct {
    char magic[8] = {'T', 'L', 'C', 'K', 'P', 'T', '0', '2'};
    std::uint64_t fingerprint;
    std::int64_t step = 1, data_position = 2;
    std::uint64_t rng_state = 3, tensor_count, payload_bytes;
  } header;
  static_assert(sizeof header == 56);
  header.fingerprint = model_fingerprint(g);
  header.tensor_count = layout.size();
  header.payload_bytes = payload;
  // Zeros but for one byte past 4 GiB. A reader whose length or offsets were 32-bit would stop
  // (or wrap) before it, and its checksum would not match the one stored, which covers it.
  const std::uint64_t marker_at = sizeof header + (std::uint64_t{1} << 32) + 1000;
  const std::uint64_t end = sizeof header + payload;
  std::uint64_t crc = crc64(std::as_bytes(std::span(&header, 1)));
  const std::vector<std::byte> zeros(8 << 20);
  auto crc_of_zeros = [&](std::uint64_t n) {
    for (; n > 0; n -= std::min<std::uint64_t>(n, zeros.size()))
      crc = crc64(std::span(zeros).first(std::min<std::uint64_t>(n, zeros.size())), crc);
  };
  crc_of_zeros(marker_at - sizeof header);
  const std::byte marker{0x5a};
  crc = crc64(std::span(&marker, 1), crc);
  crc_of_zeros(end - marker_at - 1);
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, &header, sizeof header, 0) == sizeof header);
    REQUIRE(::pwrite(fd, &marker, 1, static_cast<off_t>(marker_at)) == 1);
    REQUIRE(::pwrite(fd, &crc, 8, static_cast<off_t>(end)) == 8);
    REQUIRE(::pwrite(fd, "TLCKEND2", 8, static_cast<off_t>(end + 8)) == 8);
    ::close(fd);
  }
  REQUIRE(fs::file_size(path) == end + 16);
  auto ok = verify_checkpoint(path, g);
  INFO((ok.ok() ? std::string("ok") : ok.error().message));
  REQUIRE(ok.ok());
  CHECK(ok->step == 1);
  CHECK(ok->data_position == 2);
}

TEST_CASE(
    "CheckpointWriter: asynchronous writes take the state at submit, write the same bytes as the "
    "synchronous writer, keep generations, and report a failed write once") {
  auto plan = compile_plan(training_graph(Precision{}), PlanOptions{});
  REQUIRE(plan.ok());
  CpuExecutor<float> ex(*plan);
  ex.init_parameters(3);
  TempDir sync_dir, async_dir;
  {
    CheckpointWriter sync(sync_dir.path.string(), 2, false);
    CheckpointWriter async(async_dir.path.string(), 2, true);
    for (std::int64_t step : {10, 20, 30}) {
      REQUIRE(sync.submit(ex, {step, step, 5}).ok());
      REQUIRE(async.submit(ex, {step, step, 5}).ok());
      // Training goes on while the file is written: the file still holds the submitted values.
      for (auto p : plan->graph.params)
        for (auto& x : ex.values(p)) x += 1.0f;
    }
    REQUIRE(async.flush().ok());
    CHECK(async.last_written() == checkpoint_path(async_dir.path.string(), 30));
    CHECK(sync.last_written() == checkpoint_path(sync_dir.path.string(), 30));
  }
  CHECK(names_in(async_dir.path) == names_in(sync_dir.path));
  CHECK(names_in(async_dir.path) ==
        std::vector<std::string>{"checkpoint-000000000020.bin", "checkpoint-000000000030.bin"});
  for (std::int64_t step : {20, 30})
    CHECK(read_bytes(checkpoint_path(async_dir.path.string(), step)) ==
          read_bytes(checkpoint_path(sync_dir.path.string(), step)));

  // The destructor finishes a write that was submitted and never flushed.
  TempDir unflushed;
  {
    CheckpointWriter w(unflushed.path.string(), 2);
    REQUIRE(w.submit(ex, {40, 0, 0}).ok());
  }
  CHECK(verify_checkpoint(checkpoint_path(unflushed.path.string(), 40), plan->graph).ok());

  // A write that fails on the writer's thread: submit returned, flush says why, once.
  TempDir d;
  write_bytes(d.path / "file", "x");
  CheckpointWriter w((d.path / "file" / "ckpt").string(), 2);
  REQUIRE(w.submit(ex, {50, 0, 0}).ok());
  auto failed = w.flush();
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().exit_code == 1);
  CHECK_THAT(failed.error().message, Catch::StartsWith("checkpoint: cannot create "));
  CHECK(w.flush().ok());
  CHECK(w.last_written().empty());
}
