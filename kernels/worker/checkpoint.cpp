// Checkpoint file layout (little-endian), format 2:
//   header  : magic "TLCKPT02" | u64 fingerprint | i64 step | i64 data_position | u64 rng_state |
//             u64 tensor_count | u64 payload_bytes
//   payload : the tensors of checkpoint_layout (parameters, grad_norm, each parameter's m and v),
//             fp32, raw
//   trailer : u64 crc64(header + payload) | "TLCKEND2"
// Format 1 (dir/checkpoint.bin, read only): magic "TLCKPT01", the same header and payload,
// trailer u32 crc32(header + payload) | "TLCKEND!". Its CRC is computed here in pieces of
// at most 8 MiB, so a file of 4 GiB or more verifies (its first reader passed the whole length to
// zlib as a 32-bit uInt).
#include "topolaunch/kernels/checkpoint.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unordered_map>
#include <utility>
#include <variant>

namespace topolaunch::kernels {

static_assert(std::endian::native == std::endian::little, "the checkpoint format is little-endian");

namespace {

constexpr char kMagicV1[8] = {'T', 'L', 'C', 'K', 'P', 'T', '0', '1'};
constexpr char kMagicV2[8] = {'T', 'L', 'C', 'K', 'P', 'T', '0', '2'};
constexpr char kEndV1[8] = {'T', 'L', 'C', 'K', 'E', 'N', 'D', '!'};
constexpr char kEndV2[8] = {'T', 'L', 'C', 'K', 'E', 'N', 'D', '2'};
constexpr std::uint64_t kTrailerV1 = 4 + 8, kTrailerV2 = 8 + 8;
// Reads and writes go in pieces of this size: bounded memory, and each piece's CRC is computed
// while it is still in cache.
constexpr std::size_t kPieceBytes = 8u << 20;

struct Header {
  char magic[8];
  std::uint64_t fingerprint;
  std::int64_t step, data_position;
  std::uint64_t rng_state, tensor_count, payload_bytes;
};
static_assert(sizeof(Header) == 56);

// Slicing-by-8 tables of CRC-64/XZ: kCrcTables[0] is the byte-at-a-time table, [k] advances a
// byte k more positions. 1.3 GB/s on one core here (bench_checkpoint), against 0.16 GB/s for
// writing a checkpoint to this VM's disk with its fsync.
constexpr std::uint64_t kCrcPolynomial = 0xC96C5795D7870F42ull;  // ECMA-182, reflected
constexpr auto kCrcTables = [] {
  std::array<std::array<std::uint64_t, 256>, 8> t{};
  for (std::uint64_t i = 0; i < 256; ++i) {
    std::uint64_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCrcPolynomial : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  return t;
}();

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd = -1) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(FileDescriptor&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileDescriptor& operator=(FileDescriptor&&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string errno_text() { return std::strerror(errno); }

Status write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error("checkpoint: writing " + path + " failed: " + errno_text(), 1);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return ok_status();
}

// Reads exactly n bytes at offset; "" or why not.
std::string read_exact(int fd, void* data, std::size_t n, std::uint64_t offset) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return "cannot be read: " + errno_text();
    if (r == 0) return "shrank while being read";
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return "";
}

std::string bytes_text(std::uint64_t n) { return std::to_string(n) + " bytes"; }

std::string file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

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

std::uint64_t payload_bytes_of(const std::vector<CheckpointEntry>& layout) {
  std::uint64_t n = 0;
  for (const auto& e : layout) n += e.bytes();
  return n;
}

Header header_for(std::uint64_t fingerprint, std::uint64_t tensor_count,
                  std::uint64_t payload_bytes, const TrainingState& state) {
  Header h{};
  std::memcpy(h.magic, kMagicV2, 8);
  h.fingerprint = fingerprint;
  h.step = state.step;
  h.data_position = state.data_position;
  h.rng_state = state.rng_state;
  h.tensor_count = tensor_count;
  h.payload_bytes = payload_bytes;
  return h;
}

// A checkpoint that passed every check, still open (the loader reads the same inode).
struct CheckedFile {
  FileDescriptor fd;
  Header header{};
};

// Why a file was not taken: `foreign` = another model's (an error, not something to skip).
struct Refusal {
  std::string why;  // "is truncated (...)", without the path
  bool foreign = false;
};

// Every check of verify_checkpoint; the file stays open on success.
std::variant<CheckedFile, Refusal> check_file(const std::string& path,
                                              const std::vector<CheckpointEntry>& layout) {
  // stat before open: opening a FIFO waits for a writer, opening a device can act on it.
  struct stat named {};
  if (::stat(path.c_str(), &named) != 0) return Refusal{"cannot be read: " + errno_text()};
  if (!S_ISREG(named.st_mode))
    return Refusal{"is not a regular file (" + file_kind(named.st_mode) + "), not opened"};
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0) return Refusal{"cannot be opened: " + errno_text()};
  struct stat opened {};
  if (::fstat(fd.get(), &opened) != 0 || !S_ISREG(opened.st_mode) ||
      opened.st_ino != named.st_ino || opened.st_dev != named.st_dev)
    return Refusal{"was replaced while being opened"};
  const auto size = static_cast<std::uint64_t>(opened.st_size);
  if (size < sizeof(Header))
    return Refusal{"is truncated before its header (" + bytes_text(size) + ")"};
  CheckedFile out{std::move(fd)};
  Header& h = out.header;
  if (auto e = read_exact(out.fd.get(), &h, sizeof h, 0); !e.empty()) return Refusal{e};
  const bool v2 = std::memcmp(h.magic, kMagicV2, 8) == 0;
  if (!v2 && std::memcmp(h.magic, kMagicV1, 8) != 0)
    return Refusal{"is not a topolaunch checkpoint (no TLCKPT01/TLCKPT02 magic)"};
  const std::uint64_t payload = payload_bytes_of(layout);
  if (h.fingerprint != fingerprint_of(layout) || h.tensor_count != layout.size() ||
      h.payload_bytes != payload)
    return Refusal{"was written by a different model (parameter names/shapes differ)", true};
  const std::uint64_t trailer = v2 ? kTrailerV2 : kTrailerV1;
  const std::uint64_t expect = sizeof(Header) + payload + trailer;
  if (size < expect)
    return Refusal{"is truncated (" + bytes_text(size) + ", this model's checkpoint has " +
                   std::to_string(expect) + ")"};
  if (size > expect)
    return Refusal{"has the wrong size (" + bytes_text(size) + ", this model's checkpoint has " +
                   std::to_string(expect) + ")"};
  char tail[kTrailerV2];
  if (auto e = read_exact(out.fd.get(), tail, trailer, sizeof(Header) + payload); !e.empty())
    return Refusal{e};
  if (std::memcmp(tail + trailer - 8, v2 ? kEndV2 : kEndV1, 8) != 0)
    return Refusal{"has no end marker (an incomplete write)"};
  // The checksum over the whole length, header included, in pieces (64-bit offsets throughout).
  std::vector<std::byte> piece(kPieceBytes);
  std::uint64_t crc = 0;
  uLong crc32_value = crc32(0L, Z_NULL, 0);
  for (std::uint64_t at = 0, end = sizeof(Header) + payload; at < end;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kPieceBytes, end - at));
    if (auto e = read_exact(out.fd.get(), piece.data(), n, at); !e.empty()) return Refusal{e};
    if (v2)
      crc = crc64(std::span(piece.data(), n), crc);
    else
      crc32_value = crc32(crc32_value, reinterpret_cast<const Bytef*>(piece.data()),
                          static_cast<uInt>(n));  // n <= 8 MiB: fits uInt
    at += n;
  }
  bool matches;
  if (v2) {
    std::uint64_t stored;
    std::memcpy(&stored, tail, 8);
    matches = stored == crc;
  } else {
    std::uint32_t stored;
    std::memcpy(&stored, tail, 4);
    matches = stored == static_cast<std::uint32_t>(crc32_value);
  }
  if (!matches) return Refusal{"fails its checksum (corrupt)"};
  return out;
}

Error refusal_error(const std::string& path, const Refusal& r) {
  return make_error(
      "checkpoint: " + path + " " + r.why + "; not loaded" +
      (r.foreign ? " (use another train.checkpoint_dir or set train.resume = false)" : ""));
}

Result<TrainingState> load_checked(CheckedFile& file, const std::string& path,
                                   const std::vector<CheckpointEntry>& layout,
                                   const WriteCheckpointTensor& write) {
  std::uint64_t offset = sizeof(Header);
  std::vector<float> values;
  for (const auto& e : layout) {
    values.resize(e.elements);
    if (auto why = read_exact(file.fd.get(), values.data(), e.bytes(), offset); !why.empty())
      return make_error("checkpoint: " + path + " " + why, 1);
    offset += e.bytes();
    if (auto s = write(e, values); !s)
      return make_error(
          "checkpoint: restoring " + e.name + " from " + path + ": " + s.error().message, 1);
  }
  const Header& h = file.header;
  return TrainingState{h.step, h.data_position, h.rng_state};
}

std::string temporary_prefix(std::int64_t step) {
  return "." + std::filesystem::path(checkpoint_path("", step)).filename().string() + ".tmp.";
}

bool is_temporary_name(const std::string& name) {
  return name.starts_with(".checkpoint-") && name.find(".bin.tmp.") != std::string::npos;
}

// Keeps written_step and the keep - 1 newest older checkpoints (the legacy file counting as the
// oldest); deletes the others, those newer than written_step, and temporary files of writes
// that never finished (a killed writer). Failures to delete are not errors: the files are
// candidates a resume verifies anyway.
void prune(const std::string& dir, std::int64_t written_step, int keep) {
  int kept = 0;
  std::error_code ec;
  for (const auto& f : list_checkpoints(dir)) {
    if (f.step <= written_step && kept < keep) {
      ++kept;
      continue;
    }
    std::filesystem::remove(f.path, ec);
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (is_temporary_name(entry.path().filename().string()))
      std::filesystem::remove(entry.path(), ec);
}

using EmitBytes = std::function<Status(std::span<const std::byte>)>;

// Writes dir's generation `header.step`: a temporary name, the payload from `produce` (which
// calls emit piece by piece), the trailer, fsync, rename, fsync of the directory, prune.
Result<std::string> write_generation(const std::string& dir, const Header& header, int keep,
                                     const std::function<Status(const EmitBytes&)>& produce) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error("checkpoint: cannot create " + dir + ": " + ec.message(), 1);
  const std::string final_path = checkpoint_path(dir, header.step);
  const std::string tmp =
      (std::filesystem::path(dir) / (temporary_prefix(header.step) + std::to_string(::getpid())))
          .string();
  FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return make_error("checkpoint: cannot create " + tmp + ": " + errno_text(), 1);
  std::uint64_t crc = crc64(std::as_bytes(std::span(&header, 1)));
  std::uint64_t payload = 0;
  Status s = write_all(fd.get(), &header, sizeof header, tmp);
  if (s)
    s = produce([&](std::span<const std::byte> bytes) {
      crc = crc64(bytes, crc);
      payload += bytes.size();
      return write_all(fd.get(), bytes.data(), bytes.size(), tmp);
    });
  if (s && payload != header.payload_bytes)
    s = make_error("checkpoint: " + tmp + ": " + std::to_string(payload) +
                       " payload bytes written, the header says " +
                       std::to_string(header.payload_bytes),
                   1);
  char trailer[kTrailerV2];
  std::memcpy(trailer, &crc, 8);
  std::memcpy(trailer + 8, kEndV2, 8);
  if (s) s = write_all(fd.get(), trailer, sizeof trailer, tmp);
  if (s && ::fsync(fd.get()) != 0)
    s = make_error("checkpoint: fsync of " + tmp + " failed: " + errno_text(), 1);
  if (::close(fd.release()) != 0 && s)
    s = make_error("checkpoint: closing " + tmp + " failed: " + errno_text(), 1);
  if (!s) {
    ::unlink(tmp.c_str());
    return s.error();
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    return make_error("checkpoint: rename to " + final_path + " failed: " + why, 1);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // make the rename itself durable
    ::close(dfd);
  }
  prune(dir, header.step, keep);
  return final_path;
}

}  // namespace

std::uint64_t crc64(std::span<const std::byte> bytes, std::uint64_t crc) {
  const auto& t = kCrcTables;
  crc = ~crc;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
          t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
  }
  for (; n > 0; --n, ++p) crc = t[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
  return ~crc;
}

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

std::uint64_t model_fingerprint(const Graph& g) { return fingerprint_of(checkpoint_layout(g)); }

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "checkpoint-%012lld.bin", static_cast<long long>(step));
  return (std::filesystem::path(dir) / name).string();
}

std::string legacy_checkpoint_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "checkpoint.bin").string();
}

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointFile> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "checkpoint.bin") {
      out.push_back({entry.path().string(), -1});
      continue;
    }
    // checkpoint-<1..18 digits>.bin: the step fits an int64 whatever the digits.
    constexpr std::string_view prefix = "checkpoint-", suffix = ".bin";
    if (!name.starts_with(prefix) || !name.ends_with(suffix)) continue;
    const std::string digits =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    out.push_back({entry.path().string(), std::stoll(digits)});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return a.step != b.step ? a.step > b.step : a.path > b.path;
  });
  return out;
}

Result<std::string> write_checkpoint(const std::string& dir, const Graph& g,
                                     const ReadCheckpointTensor& read, const TrainingState& state,
                                     int keep) {
  const auto layout = checkpoint_layout(g);
  const Header h =
      header_for(fingerprint_of(layout), layout.size(), payload_bytes_of(layout), state);
  return write_generation(dir, h, keep, [&](const EmitBytes& emit) -> Status {
    std::vector<float> values;
    for (const auto& e : layout) {
      values.assign(e.elements, 0.0f);
      if (auto s = read(e, values); !s) return s;
      if (auto s = emit(std::as_bytes(std::span(values))); !s) return s;
    }
    return ok_status();
  });
}

Result<TrainingState> verify_checkpoint(const std::string& path, const Graph& g) {
  auto checked = check_file(path, checkpoint_layout(g));
  if (auto* r = std::get_if<Refusal>(&checked)) return refusal_error(path, *r);
  const Header& h = std::get<CheckedFile>(checked).header;
  return TrainingState{h.step, h.data_position, h.rng_state};
}

Result<TrainingState> load_checkpoint(const std::string& path, const Graph& g,
                                      const WriteCheckpointTensor& write) {
  const auto layout = checkpoint_layout(g);
  auto checked = check_file(path, layout);
  if (auto* r = std::get_if<Refusal>(&checked)) return refusal_error(path, *r);
  return load_checked(std::get<CheckedFile>(checked), path, layout, write);
}

Result<std::optional<ResumePoint>> resume_from_newest(const std::string& dir, const Graph& g,
                                                      const WriteCheckpointTensor& write) {
  const auto files = list_checkpoints(dir);
  if (files.empty()) return std::optional<ResumePoint>();
  const auto layout = checkpoint_layout(g);
  ResumePoint point;
  std::string all_reasons;
  for (const auto& f : files) {
    auto checked = check_file(f.path, layout);
    if (auto* c = std::get_if<CheckedFile>(&checked); c && f.step >= 0 && c->header.step != f.step)
      checked = Refusal{"holds step " + std::to_string(c->header.step) + ", its name says " +
                        std::to_string(f.step)};
    if (auto* r = std::get_if<Refusal>(&checked)) {
      if (r->foreign) return refusal_error(f.path, *r);
      point.skipped.push_back("checkpoint: skipped " + f.path + ": " + r->why);
      all_reasons += (all_reasons.empty() ? "" : "; ") +
                     std::filesystem::path(f.path).filename().string() + " " + r->why;
      continue;
    }
    auto state = load_checked(std::get<CheckedFile>(checked), f.path, layout, write);
    if (!state) return state.error();
    point.path = f.path;
    point.state = *state;
    return std::optional<ResumePoint>(std::move(point));
  }
  return make_error("checkpoint: no good checkpoint in " + dir + ": " + all_reasons +
                    " (set train.resume = false to start afresh)");
}

std::vector<CheckpointPart> checkpoint_parts(const Graph& g, const CommPlan& comm) {
  std::vector<CheckpointPart> parts;
  if (comm.shard == ShardMode::none) return parts;
  struct Place {
    int bucket;
    const BucketMember* member;
  };
  std::unordered_map<std::string, Place> member_of;  // parameter name -> its bucket member
  for (std::size_t k = 0; k < comm.buckets.size(); ++k)
    for (const auto& m : comm.buckets[k].members)
      member_of.emplace(g[m.param].name, Place{static_cast<int>(k), &m});
  const auto layout = checkpoint_layout(g);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const CheckpointEntry& e = layout[i];
    std::string param = e.name;
    CheckpointPart::Source source = CheckpointPart::Source::parameter;
    if (e.kind == CheckpointEntry::Kind::optimizer_state) {
      if (e.name.ends_with(".m") || e.name.ends_with(".v")) {
        source = e.name.ends_with(".m") ? CheckpointPart::Source::m : CheckpointPart::Source::v;
        param = e.name.substr(0, e.name.size() - 2);
      } else {
        source = CheckpointPart::Source::whole;
      }
    }
    auto it = member_of.find(param);
    if (source == CheckpointPart::Source::whole || it == member_of.end()) {
      if (comm.rank == 0) parts.push_back({i, 0, e.elements, CheckpointPart::Source::whole, -1, 0});
      continue;
    }
    const Bucket& b = comm.buckets[static_cast<std::size_t>(it->second.bucket)];
    const ShardSlice sl = shard_slice(b, *it->second.member, comm.rank);
    if (sl.count == 0) continue;
    parts.push_back({i, static_cast<std::size_t>(sl.member_begin),
                     static_cast<std::size_t>(sl.count), source, it->second.bucket,
                     static_cast<std::size_t>(sl.shard_offset)});
  }
  return parts;
}

namespace {

Status pwrite_all(int fd, const void* data, std::size_t n, std::uint64_t offset,
                  const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error("checkpoint: writing " + path + " failed: " + errno_text(), 1);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
  return ok_status();
}

}  // namespace

Result<std::string> write_checkpoint_parts(const std::string& dir, const Graph& g,
                                           const std::vector<CheckpointPart>& parts,
                                           const ReadCheckpointPart& read,
                                           const TrainingState& state, int keep, int rank,
                                           const SumOverRanks& sum_over_ranks) {
  const auto layout = checkpoint_layout(g);
  std::vector<std::uint64_t> entry_offset;  // in the file
  std::uint64_t payload = 0;
  for (const auto& e : layout) {
    entry_offset.push_back(sizeof(Header) + payload);
    payload += e.bytes();
  }
  const Header h = header_for(fingerprint_of(layout), layout.size(), payload, state);
  const std::string tmp =
      (std::filesystem::path(dir) / (temporary_prefix(h.step) + "shards")).string();
  const std::string final_path = checkpoint_path(dir, h.step);
  // Every rank learns whether every rank got this far; the first error is this rank's own.
  auto agree = [&](Status mine, const char* stage) -> Status {
    auto failed = sum_over_ranks(mine ? 0.0 : 1.0);
    if (!failed) return mine ? Status(failed.error()) : mine;
    if (!mine) return mine;
    if (*failed > 0.5)
      return make_error(
          "checkpoint: rank " + std::to_string(rank) + ": another rank failed " + stage + " " + tmp,
          1);
    return ok_status();
  };
  Status s = ok_status();
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (ec)
      s = make_error("checkpoint: cannot create " + dir + ": " + ec.message(), 1);
    else if (fd.get() < 0)
      s = make_error("checkpoint: cannot create " + tmp + ": " + errno_text(), 1);
    else if (::ftruncate(fd.get(), static_cast<off_t>(sizeof(Header) + payload + kTrailerV2)) != 0)
      s = make_error("checkpoint: cannot size " + tmp + ": " + errno_text(), 1);
    else
      s = pwrite_all(fd.get(), &h, sizeof h, 0, tmp);
  }
  if (auto a = agree(s, "creating"); !a) return a.error();
  {
    FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CLOEXEC));
    if (fd.get() < 0) s = make_error("checkpoint: cannot open " + tmp + ": " + errno_text(), 1);
    std::vector<float> values;
    for (const auto& part : parts) {
      if (!s) break;
      values.assign(part.count, 0.0f);
      s = read(part, values);
      if (s)
        s = pwrite_all(fd.get(), values.data(), part.count * sizeof(float),
                       entry_offset[part.entry] + part.begin * sizeof(float), tmp);
    }
    if (s && ::fsync(fd.get()) != 0)
      s = make_error("checkpoint: fsync of " + tmp + " failed: " + errno_text(), 1);
  }
  if (auto a = agree(s, "writing its part of"); !a) {
    if (rank == 0) ::unlink(tmp.c_str());
    return a.error();
  }
  if (rank != 0) return final_path;
  // Rank 0: the checksum over header and payload as the ranks wrote them, the trailer, rename.
  FileDescriptor fd(::open(tmp.c_str(), O_RDWR | O_CLOEXEC));
  if (fd.get() < 0) return make_error("checkpoint: cannot open " + tmp + ": " + errno_text(), 1);
  std::vector<std::byte> piece(kPieceBytes);
  std::uint64_t crc = 0;
  for (std::uint64_t at = 0, end = sizeof(Header) + payload; at < end && s;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kPieceBytes, end - at));
    if (auto e = read_exact(fd.get(), piece.data(), n, at); !e.empty())
      s = make_error("checkpoint: " + tmp + " " + e, 1);
    crc = crc64(std::span(piece.data(), n), crc);
    at += n;
  }
  char trailer[kTrailerV2];
  std::memcpy(trailer, &crc, 8);
  std::memcpy(trailer + 8, kEndV2, 8);
  if (s) s = pwrite_all(fd.get(), trailer, sizeof trailer, sizeof(Header) + payload, tmp);
  if (s && ::fsync(fd.get()) != 0)
    s = make_error("checkpoint: fsync of " + tmp + " failed: " + errno_text(), 1);
  if (::close(fd.release()) != 0 && s)
    s = make_error("checkpoint: closing " + tmp + " failed: " + errno_text(), 1);
  if (s && ::rename(tmp.c_str(), final_path.c_str()) != 0)
    s = make_error("checkpoint: rename to " + final_path + " failed: " + errno_text(), 1);
  if (!s) {
    ::unlink(tmp.c_str());
    return s.error();
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  prune(dir, h.step, keep);
  return final_path;
}

ReadCheckpointTensor read_from_executor(CpuExecutor<float>& ex) {
  return [&ex](const CheckpointEntry& e, std::span<float> out) {
    std::memcpy(out.data(), ex.data(e.tensor), e.bytes());
    return ok_status();
  };
}

namespace {

float* shard_values(CpuExecutor<float>& ex, const CheckpointPart& part) {
  const Bucket& b = ex.plan().comm.buckets[static_cast<std::size_t>(part.bucket)];
  const TensorId t = part.source == CheckpointPart::Source::parameter ? b.param_shard
                     : part.source == CheckpointPart::Source::m       ? b.m_shard
                                                                      : b.v_shard;
  return ex.data(t) + part.shard_offset;
}

}  // namespace

// A sharded plan: a parameter is stored whole where every rank holds it whole (ZeRO-1/2, whose
// forward reads it all), else its part; .m and .v always by part.
WriteCheckpointTensor write_to_executor(CpuExecutor<float>& ex) {
  if (ex.plan().comm.shard == ShardMode::none)
    return [&ex](const CheckpointEntry& e, std::span<const float> values) {
      std::memcpy(ex.data(e.tensor), values.data(), e.bytes());
      return ok_status();
    };
  auto parts = std::make_shared<std::vector<CheckpointPart>>(
      checkpoint_parts(ex.plan().graph, ex.plan().comm));
  auto layout = std::make_shared<std::vector<CheckpointEntry>>(checkpoint_layout(ex.plan().graph));
  return [&ex, parts, layout](const CheckpointEntry& e, std::span<const float> values) {
    if (e.kind == CheckpointEntry::Kind::parameter) {
      ex.set_parameter(e.tensor, values);
      return ok_status();
    }
    if (ex.data(e.tensor) != nullptr) {  // grad_norm: every rank holds it
      std::memcpy(ex.data(e.tensor), values.data(), e.bytes());
      return ok_status();
    }
    for (const auto& part : *parts)
      if ((*layout)[part.entry].tensor == e.tensor && part.bucket >= 0)
        std::memcpy(shard_values(ex, part), values.data() + part.begin, part.count * sizeof(float));
    return ok_status();
  };
}

ReadCheckpointPart read_part_from_executor(CpuExecutor<float>& ex) {
  const auto layout =
      std::make_shared<std::vector<CheckpointEntry>>(checkpoint_layout(ex.plan().graph));
  return [&ex, layout](const CheckpointPart& part, std::span<float> out) {
    const float* src = part.source == CheckpointPart::Source::whole
                           ? ex.data((*layout)[part.entry].tensor)
                           : shard_values(ex, part);
    std::memcpy(out.data(), src, part.count * sizeof(float));
    return ok_status();
  };
}

Result<std::string> write_checkpoint(const std::string& dir, CpuExecutor<float>& ex,
                                     const TrainingState& state, int keep) {
  return write_checkpoint(dir, ex.plan().graph, read_from_executor(ex), state, keep);
}

Result<TrainingState> load_checkpoint(const std::string& path, CpuExecutor<float>& ex) {
  return load_checkpoint(path, ex.plan().graph, write_to_executor(ex));
}

Result<std::optional<ResumePoint>> resume_from_newest(const std::string& dir,
                                                      CpuExecutor<float>& ex) {
  return resume_from_newest(dir, ex.plan().graph, write_to_executor(ex));
}

// --- CheckpointWriter ---------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(std::string dir, int keep, bool asynchronous)
    : dir_(std::move(dir)), keep_(std::max(1, keep)), asynchronous_(asynchronous) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status CheckpointWriter::submit(const Graph& g, const ReadCheckpointTensor& read,
                                const TrainingState& state) {
  if (!asynchronous_) {
    auto path = write_checkpoint(dir_, g, read, state, keep_);
    if (!path) return path.error();
    std::lock_guard lock(mutex_);
    last_written_ = *path;
    return ok_status();
  }
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !pending_; });
  if (error_) return std::exchange(error_, std::nullopt).value();
  lock.unlock();  // the thread is idle until pending_ is set: the buffer is ours
  const auto layout = checkpoint_layout(g);
  std::uint64_t elements = 0;
  for (const auto& e : layout) elements += e.elements;
  payload_.resize(elements);
  std::size_t offset = 0;
  for (const auto& e : layout) {
    if (auto s = read(e, std::span(payload_).subspan(offset, e.elements)); !s) return s;
    offset += e.elements;
  }
  fingerprint_ = fingerprint_of(layout);
  tensor_count_ = layout.size();
  state_ = state;
  lock.lock();
  pending_ = true;
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  lock.unlock();
  changed_.notify_all();
  return ok_status();
}

Status CheckpointWriter::submit(CpuExecutor<float>& ex, const TrainingState& state) {
  return submit(ex.plan().graph, read_from_executor(ex), state);
}

Status CheckpointWriter::flush() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !pending_; });
  if (error_) return std::exchange(error_, std::nullopt).value();
  return ok_status();
}

std::string CheckpointWriter::last_written() const {
  std::lock_guard lock(mutex_);
  return last_written_;
}

void CheckpointWriter::run() {
  // The step loop's thread takes SIGUSR1/SIGTERM (its handler sets the stop flag it reads).
  sigset_t all;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return pending_ || stopping_; });
    if (!pending_) return;  // stopping, nothing left to write
    lock.unlock();
    write_pending();
    lock.lock();
    pending_ = false;
    changed_.notify_all();
  }
}

void CheckpointWriter::write_pending() {
  const Header h = header_for(fingerprint_, tensor_count_, payload_.size() * sizeof(float), state_);
  auto path = write_generation(dir_, h, keep_, [&](const EmitBytes& emit) -> Status {
    const auto bytes = std::as_bytes(std::span(payload_));
    for (std::size_t at = 0; at < bytes.size(); at += kPieceBytes)
      if (auto s = emit(bytes.subspan(at, std::min(kPieceBytes, bytes.size() - at))); !s) return s;
    return ok_status();
  });
  std::lock_guard lock(mutex_);
  if (path)
    last_written_ = *path;
  else
    error_ = path.error();
}

}  // namespace topolaunch::kernels
