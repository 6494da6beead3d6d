// Writes the seed inputs that the code itself produces: store frames (encode_frame, PayloadWriter,
// a real client proof is made by the harness), PMI2 values, a checkpoint of the tiny model
// (write_checkpoint) and llm.c token files. The text seeds (job files, hwloc XML, SPANK options)
// are copies of the fixtures, committed as seed-* (docs/fuzzing.md lists them).
//
// usage: fuzz_make_seeds CORPUS_ROOT   (writes CORPUS_ROOT/<harness>/seed-*)
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "frame.hpp"
#include "tiny_model.hpp"
#include "topolaunch/kernels/checkpoint.hpp"

using namespace topolaunch;
using namespace topolaunch::wireup;
namespace fs = std::filesystem;

namespace {

fs::path root;

void write(const std::string& harness, const std::string& name, const std::string& bytes) {
  fs::create_directories(root / harness);
  std::ofstream(root / harness / ("seed-" + name), std::ios::binary) << bytes;
}

std::string text(const Bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::string frame(proto::Op op, const proto::PayloadWriter& w) {
  return text(proto::encode_frame(op, w.data()));
}

using W = proto::PayloadWriter;

void store_seeds() {
  using proto::Op;
  const std::string nonce(proto::kNonceBytes, 'n');
  // Mode 0x00: raw, the auth frame itself (its MAC is wrong; the parse is what is fuzzed).
  write("store_frames", "auth-raw",
        std::string(1, '\x00') +
            frame(Op::auth, W().i64(0).i64(1).str(nonce).str(std::string(32, 'm'))));
  // Mode 0x04: rank 0 of world 1, every request kind.
  std::string rank0 = std::string(1, '\x04');
  rank0 += frame(Op::set, W().str("a").str("1"));
  rank0 += frame(Op::set_many, W().u64(2).str("b").str("x").str("c").str("y"));
  rank0 += frame(Op::get, W().str("a").u64(10));
  rank0 += frame(Op::add, W().str("n").i64(5));
  rank0 += frame(Op::wait, W().u64(2).str("a").str("b").u64(10));
  rank0 += frame(Op::get_many, W().u64(2).str("b").str("c").u64(10));
  rank0 += frame(Op::fence, W().u64(1).u64(10));
  rank0 += frame(Op::allgather, W().str("g").u64(10).str("v"));
  rank0 += frame(Op::remove, W().str("a"));
  write("store_frames", "rank0-requests", rank0);
  // Mode 0x04: a get that parks (the key never comes), then the half-close.
  write("store_frames", "rank0-parked-get",
        std::string(1, '\x04') + frame(Op::get, W().str("none").u64(60000)));
  // Mode 0x02: a tool without a rank: fence and allgather are refused with a reason.
  write("store_frames", "norank-fence",
        std::string(1, '\x02') + frame(Op::fence, W().u64(1).u64(10)) +
            frame(Op::get, W().str("k").u64(0)));
  // Mode 0x06: a relay standing for rank 0.
  std::string relay = std::string(1, '\x06');
  relay += frame(Op::fence_group, W().u64(1).u64(10).u64(1).u64(0));
  relay += frame(Op::allgather_group, W().str("g").u64(10).u64(1).u64(0).str("v"));
  write("store_frames", "relay-groups", relay);
  // Mode 0x0c: rank 0 of world 2: the fence waits for rank 1 until the half-close.
  write("store_frames", "world2-fence",
        std::string(1, '\x0c') + frame(Op::fence, W().u64(7).u64(60000)));
  // Mode 0x80: the client's handshake against a store that cannot prove the secret.
  write("store_frames", "client-challenge",
        std::string(1, '\x80') + frame(Op::challenge, W().str(nonce)) +
            frame(Op::auth_ok, W().i64(1).str(std::string(32, 'p')).u64(65536)));
  write("store_frames", "client-refused",
        std::string(1, '\x80') + frame(Op::challenge, W().str(nonce)) +
            frame(Op::error, W().str("authentication failed")));
}

void pmi2_seeds() {
  write("pmi2_codec", "small", "\x20hello");
  write("pmi2_codec", "binary", std::string("\x05\x00\x01\x02\xfe\xff", 6));
  write("pmi2_codec", "chunks",
        std::string("\x00"
                    "3:aGVs\nbG8g\nd29ybGQ",
                    20));
  write("pmi2_codec", "one-chunk",
        "\xff"
        "1:d29ybGQ");
}

void checkpoint_seeds() {
  const kernels::Graph g = fuzz::tiny_training_graph();
  const fs::path dir = root / "checkpoint.tmp";
  float x = 0;
  auto read = [&](const kernels::CheckpointEntry&, std::span<float> out) {
    for (auto& v : out) v = (x += 0.5f);
    return ok_status();
  };
  auto written = kernels::write_checkpoint(dir.string(), g, read, {3, 96, 12345}, 1);
  if (!written) {
    std::fprintf(stderr, "%s\n", written.error().message.c_str());
    std::exit(1);
  }
  std::ifstream in(*written, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  fs::remove_all(dir);
  write("checkpoint", "tiny-mlp", bytes);
  write("checkpoint", "truncated", bytes.substr(0, bytes.size() / 2));
}

std::string token_file(std::int32_t magic, std::int32_t version, std::int32_t count,
                       const std::vector<std::uint16_t>& tokens, std::int32_t vocab = 0) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  header[3] = vocab;  // data prepare's vocabulary (0: llm.c's, GPT-2's)
  std::string out(reinterpret_cast<const char*>(header.data()), 1024);
  out.append(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
  return out;
}

void token_seeds() {
  write("token_file", "three", token_file(20240520, 1, 3, {50256, 15496, 11}));
  write("token_file", "count-past-end", token_file(20240520, 1, 9, {1, 2}));
  write("token_file", "outside-vocab", token_file(20240520, 1, 2, {7, 50257}));
  write("token_file", "vocab-512", token_file(20240520, 1, 3, {3, 511, 0}, 512));
  write("token_file", "outside-own-vocab", token_file(20240520, 1, 2, {3, 512}, 512));
  write("token_file", "vocab-above-uint16", token_file(20240520, 1, 1, {3}, 70000));
  write("token_file", "vocab-negative", token_file(20240520, 1, 1, {3}, -4));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds CORPUS_ROOT\n");
    return 2;
  }
  root = argv[1];
  store_seeds();
  pmi2_seeds();
  checkpoint_seeds();
  token_seeds();
  return 0;
}
