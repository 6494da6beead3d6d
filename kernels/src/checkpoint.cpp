// Checkpoint file layout (little-endian):
//   header  : magic "TLCKPT01" | u64 fingerprint | i64 step | i64 data_position | u64 rng_state |
//             u64 tensor_count | u64 payload_bytes
//   payload : the tensors of checkpoint_layout (parameters, grad_norm, each parameter's m and v),
//             fp32, raw
//   trailer : u32 crc32(header + payload) | "TLCKEND!"
#include "topolaunch/kernels/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <vector>

namespace topolaunch::kernels {

namespace {

constexpr char kMagic[8] = {'T', 'L', 'C', 'K', 'P', 'T', '0', '1'};
constexpr char kEnd[8] = {'T', 'L', 'C', 'K', 'E', 'N', 'D', '!'};

struct Header {
  char magic[8];
  std::uint64_t fingerprint;
  std::int64_t step, data_position;
  std::uint64_t rng_state, tensor_count, payload_bytes;
};
static_assert(sizeof(Header) == 56);

Status write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error("checkpoint: writing " + path + " failed: " + std::strerror(errno), 1);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return ok_status();
}

}  // namespace

std::vector<CheckpointEntry> checkpoint_layout(const Graph& g) {
  std::unordered_map<std::string, TensorId> state;  // optimizer-state tensors by name
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors.size()); ++t)
    if (g[t].role == Role::optimizer_state) state.emplace(g[t].name, t);
  std::vector<CheckpointEntry> out;
  auto add = [&](CheckpointEntry::Kind kind, TensorId t, const std::string& name) {
    CheckpointEntry e;
    e.kind = kind;
    e.tensor = t;
    e.name = name;
    e.shape = g[t].shape;
    e.elements = static_cast<std::size_t>(g[t].elements());
    out.push_back(std::move(e));
  };
  for (auto p : g.params) add(CheckpointEntry::Kind::parameter, p, g[p].name);
  if (auto it = state.find("grad_norm"); it != state.end())
    add(CheckpointEntry::Kind::optimizer_state, it->second, it->first);
  for (auto p : g.params)
    for (const char* suffix : {".m", ".v"})
      if (auto it = state.find(g[p].name + suffix); it != state.end())
        add(CheckpointEntry::Kind::optimizer_state, it->second, it->first);
  return out;
}

namespace {

std::uint64_t fingerprint_of(const std::vector<CheckpointEntry>& layout) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
  };
  for (const auto& e : layout) {
    mix(e.name);
    for (auto d : e.shape) mix(":" + std::to_string(d));
    mix("f32;");  // every saved value is fp32 whatever the backend's parameter dtype
  }
  return h;
}

}  // namespace

std::uint64_t model_fingerprint(const Graph& g) { return fingerprint_of(checkpoint_layout(g)); }

std::string checkpoint_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "checkpoint.bin").string();
}

Status write_checkpoint(const std::string& dir, const Graph& g, const ReadCheckpointTensor& read,
                        const TrainingState& state) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error("checkpoint: cannot create " + dir + ": " + ec.message(), 1);
  const auto layout = checkpoint_layout(g);
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.fingerprint = fingerprint_of(layout);
  h.step = state.step;
  h.data_position = state.data_position;
  h.rng_state = state.rng_state;
  h.tensor_count = layout.size();
  for (const auto& e : layout) h.payload_bytes += e.bytes();
  const std::string final_path = checkpoint_path(dir);
  const std::string tmp = final_path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return make_error("checkpoint: cannot create " + tmp + ": " + std::strerror(errno), 1);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(&h), sizeof h);
  Status s = write_all(fd, &h, sizeof h, tmp);
  std::vector<float> values;
  for (const auto& e : layout) {
    if (!s) break;
    values.assign(e.elements, 0.0f);
    s = read(e, values);
    if (!s) break;
    const auto* p = reinterpret_cast<const Bytef*>(values.data());
    crc = crc32(crc, p, static_cast<uInt>(e.bytes()));
    s = write_all(fd, p, e.bytes(), tmp);
  }
  const std::uint32_t crc32v = static_cast<std::uint32_t>(crc);
  if (s) s = write_all(fd, &crc32v, 4, tmp);
  if (s) s = write_all(fd, kEnd, 8, tmp);
  if (s && ::fsync(fd) != 0)
    s = make_error("checkpoint: fsync of " + tmp + " failed: " + std::strerror(errno), 1);
  ::close(fd);
  if (!s) {
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return make_error("checkpoint: rename to " + final_path + " failed: " + std::strerror(errno),
                      1);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // make the rename itself durable
    ::close(dfd);
  }
  return ok_status();
}

Result<TrainingState> load_checkpoint(const std::string& path, const Graph& g,
                                      const WriteCheckpointTensor& write) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("checkpoint: cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string buf = ss.str();
  if (buf.size() < sizeof(Header) + 12 || std::memcmp(buf.data(), kMagic, 8) != 0)
    return make_error("checkpoint: " + path +
                      " is not a topolaunch checkpoint (or is truncated before its header)");
  Header h;
  std::memcpy(&h, buf.data(), sizeof h);
  if (buf.size() != sizeof h + h.payload_bytes + 12 ||
      std::memcmp(buf.data() + buf.size() - 8, kEnd, 8) != 0)
    return make_error("checkpoint: " + path + " is truncated (" + std::to_string(buf.size()) +
                      " bytes, expected " + std::to_string(sizeof h + h.payload_bytes + 12) +
                      "); not loaded");
  std::uint32_t stored;
  std::memcpy(&stored, buf.data() + sizeof h + h.payload_bytes, 4);
  const auto computed = static_cast<std::uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(buf.data()),
            static_cast<uInt>(sizeof h + h.payload_bytes)));
  if (stored != computed)
    return make_error("checkpoint: " + path + " fails its checksum (corrupt); not loaded");
  const auto layout = checkpoint_layout(g);
  std::uint64_t expect = 0;
  for (const auto& e : layout) expect += e.bytes();
  if (h.fingerprint != fingerprint_of(layout) || h.tensor_count != layout.size() ||
      h.payload_bytes != expect)
    return make_error("checkpoint: " + path +
                      " was written by a different model (parameter names/shapes differ); not "
                      "loaded (use another "
                      "train.checkpoint_dir or set train.resume = false)");
  std::size_t off = sizeof h;
  std::vector<float> values;
  for (const auto& e : layout) {
    values.resize(e.elements);
    std::memcpy(values.data(), buf.data() + off, e.bytes());
    off += e.bytes();
    if (auto s = write(e, values); !s)
      return make_error(
          "checkpoint: restoring " + e.name + " from " + path + ": " + s.error().message, 1);
  }
  return TrainingState{h.step, h.data_position, h.rng_state};
}

Status write_checkpoint(const std::string& dir, CpuExecutor<float>& ex,
                        const TrainingState& state) {
  return write_checkpoint(
      dir, ex.plan().graph,
      [&](const CheckpointEntry& e, std::span<float> out) {
        std::memcpy(out.data(), ex.data(e.tensor), e.bytes());
        return ok_status();
      },
      state);
}

Result<TrainingState> load_checkpoint(const std::string& path, CpuExecutor<float>& ex) {
  return load_checkpoint(path, ex.plan().graph,
                         [&](const CheckpointEntry& e, std::span<const float> values) {
                           std::memcpy(ex.data(e.tensor), values.data(), e.bytes());
                           return ok_status();
                         });
}

}  // namespace topolaunch::kernels
