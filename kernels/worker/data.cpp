// Data loading: text (character level), R lazy-load databases (janeaustenr), llm.c token files.
#include "topolaunch/kernels/data.hpp"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace topolaunch::kernels {

namespace fs = std::filesystem;

namespace {

Result<std::string> slurp(const std::string& path, const std::string& key = "data.path") {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(key + ": cannot open " + path + " (check the path and permissions)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Text: no NUL bytes and at most 1% control characters other than tab/newline/CR/form feed.
bool looks_like_text(const std::string& s) {
  std::size_t control = 0;
  for (unsigned char c : s) {
    if (c == 0) return false;
    if (c < 32 && c != '\n' && c != '\t' && c != '\r' && c != '\f') ++control;
  }
  return control * 100 <= s.size();
}

}  // namespace

Result<std::string> read_text(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file() && e.path().extension() != ".dat" && e.path().extension() != ".u8")
        files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::string all;
    for (const auto& f : files) {
      auto t = slurp(f.string());
      if (!t) return t.error();
      if (!t->empty() && looks_like_text(*t)) all += *t;
    }
    if (all.empty()) return make_error("data.path: " + path + " holds no non-empty text files");
    return all;
  }
  if (!fs::exists(path, ec)) return make_error("data.path: " + path + " does not exist");
  auto t = slurp(path);
  if (!t) return t.error();
  if (t->empty()) return make_error("data.path: " + path + " is empty (nothing to train on)");
  if (!looks_like_text(*t))
    return make_error("data.path: " + path +
                      " is not a text file (binary bytes found); use data.kind = \"tokens\" for "
                      "llm.c .bin files");
  return t;
}

Result<Dataset> char_level_dataset(const std::string& text, const std::string& what) {
  Dataset d;
  std::array<int, 256> id{};
  id.fill(-1);
  for (unsigned char c : text) id[c] = 0;
  for (int c = 0; c < 256; ++c) {
    if (id[static_cast<std::size_t>(c)] == 0) {
      id[static_cast<std::size_t>(c)] = static_cast<int>(d.byte_of_token.size());
      d.byte_of_token.push_back(static_cast<unsigned char>(c));
    }
  }
  d.vocab_size = static_cast<std::int64_t>(d.byte_of_token.size());
  d.tokens.reserve(text.size());
  for (unsigned char c : text) d.tokens.push_back(id[c]);
  d.description = what + ": " + std::to_string(text.size()) + " characters, vocabulary " +
                  std::to_string(d.vocab_size);
  return d;
}

namespace {

// Minimal reader of R's XDR serialisation (format 'X', versions 2 and 3): enough to walk a
// character vector (STRSXP of CHARSXPs). Other object types are reported as unsupported.
struct XdrReader {
  const std::string& buf;
  std::size_t pos = 0;
  bool ok = true;
  std::int32_t i32() {
    if (pos + 4 > buf.size()) {
      ok = false;
      return 0;
    }
    const auto* p = reinterpret_cast<const unsigned char*>(buf.data() + pos);
    pos += 4;
    return static_cast<std::int32_t>((std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
                                     (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]});
  }
  std::string bytes(std::size_t n) {
    if (pos + n > buf.size()) {
      ok = false;
      return {};
    }
    std::string s = buf.substr(pos, n);
    pos += n;
    return s;
  }
};

constexpr int kCharSxp = 9, kStrSxp = 16;

}  // namespace

Result<std::string> decode_r_lazyload_text(const std::string& rdb_path) {
  auto raw = slurp(rdb_path);
  if (!raw) return raw.error();
  const std::string& db = *raw;
  std::string text;
  std::size_t pos = 0, objects = 0;
  while (pos + 4 <= db.size()) {
    const auto* p = reinterpret_cast<const unsigned char*>(db.data() + pos);
    const std::size_t out_len =
        (std::size_t{p[0]} << 24) | (std::size_t{p[1]} << 16) | (std::size_t{p[2]} << 8) | p[3];
    std::string out(out_len, '\0');
    z_stream z{};
    if (inflateInit(&z) != Z_OK) return make_error("data.path: zlib init failed");
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(db.data() + pos + 4));
    z.avail_in = static_cast<uInt>(db.size() - pos - 4);
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    const int rc = inflate(&z, Z_FINISH);
    const std::size_t consumed = z.total_in;
    inflateEnd(&z);
    if (rc != Z_STREAM_END || z.total_out != out_len)
      return make_error(
          "data.path: " + rdb_path + ": object at byte " + std::to_string(pos) +
          " is not a zlib stream of the announced length (not an R lazy-load database?)");
    pos += 4 + consumed;
    ++objects;
    XdrReader r{out};
    if (r.bytes(2) != "X\n")
      return make_error("data.path: " + rdb_path + ": object is not XDR-serialised R data");
    const std::int32_t version = r.i32();
    r.i32();  // writer R version
    r.i32();  // minimal reader version
    if (version == 3) {
      const std::int32_t n = r.i32();
      r.bytes(static_cast<std::size_t>(std::max(0, n)));  // native encoding name
    }
    const std::int32_t flags = r.i32();
    if ((flags & 0xFF) != kStrSxp) continue;  // not a character vector: skip
    const std::int32_t length = r.i32();
    for (std::int32_t i = 0; i < length && r.ok; ++i) {
      const std::int32_t cflags = r.i32();
      if ((cflags & 0xFF) != kCharSxp)
        return make_error("data.path: " + rdb_path + ": unexpected element type");
      const std::int32_t n = r.i32();
      if (n >= 0) text += r.bytes(static_cast<std::size_t>(n));  // n = -1 is NA: an empty line
      text += '\n';
    }
    if (!r.ok) return make_error("data.path: " + rdb_path + ": truncated R object");
  }
  if (objects == 0 || text.empty())
    return make_error("data.path: " + rdb_path + " holds no character vectors");
  return text;
}

Result<Dataset> load_token_file(const std::string& path, const std::string& key) {
  auto raw = slurp(path, key);
  if (!raw) return raw.error();
  const std::string& s = *raw;
  const std::string where = key + ": " + path;
  if (s.empty()) return make_error(where + " is empty (nothing to train on)");
  if (s.size() < 1024)
    return make_error(where + " is too short for an llm.c token file (needs a 1024-byte header)");
  std::array<std::int32_t, 256> h{};
  std::memcpy(h.data(), s.data(), 1024);
  if (h[0] != kTokenFileMagic)
    return make_error(where + ": bad magic " + std::to_string(h[0]) +
                      " (expected 20240520, an llm.c token file)");
  if (h[1] != 1)
    return make_error(where + ": unsupported version " + std::to_string(h[1]) +
                      " (1: uint16 tokens)");
  if (h[3] < 0 || h[3] > kMaxTokenFileVocabulary)
    return make_error(where + ": header gives a vocabulary of " + std::to_string(h[3]) +
                      " (uint16 tokens: at most 65535)");
  const std::int64_t vocab = h[3] > 0 ? h[3] : kGpt2Vocabulary;
  const std::size_t count = static_cast<std::size_t>(std::max(h[2], 0));
  if (h[2] <= 0 || 1024 + 2 * count > s.size())
    return make_error(where + ": header says " + std::to_string(h[2]) +
                      " tokens but the file holds " + std::to_string((s.size() - 1024) / 2));
  Dataset d;
  d.vocab_size = vocab;
  d.tokens.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t v;
    std::memcpy(&v, s.data() + 1024 + 2 * i, 2);
    if (v >= vocab)
      return make_error(where + ": token " + std::to_string(v) + " at " + std::to_string(i) +
                        " is outside its vocabulary of " + std::to_string(vocab) +
                        (h[3] > 0 ? "" : " (GPT-2's: header[3] is 0)"));
    d.tokens[i] = v;
  }
  d.description = path + ": " + std::to_string(count) + " tokens, vocabulary " +
                  std::to_string(vocab) + (h[3] > 0 ? "" : " (GPT-2)");
  return d;
}

TokenFileWriter::TokenFileWriter(std::string path, std::FILE* file, std::int64_t vocab)
    : path_(std::move(path)), temporary_(path_ + ".tmp"), file_(file), vocab_(vocab) {}

TokenFileWriter::TokenFileWriter(TokenFileWriter&& o) noexcept
    : path_(std::move(o.path_)),
      temporary_(std::move(o.temporary_)),
      file_(o.file_),
      vocab_(o.vocab_),
      count_(o.count_) {
  o.file_ = nullptr;
}

TokenFileWriter::~TokenFileWriter() {
  if (file_ != nullptr) {  // not finished: nothing half-written stays
    std::fclose(file_);
    std::remove(temporary_.c_str());
  }
}

Result<TokenFileWriter> TokenFileWriter::create(const std::string& path, std::int64_t vocab) {
  if (vocab < 1 || vocab > kMaxTokenFileVocabulary)
    return make_error(path + ": a vocabulary of " + std::to_string(vocab) +
                      " does not fit uint16 tokens (at most 65535)");
  const std::string temporary = path + ".tmp";
  std::FILE* f = std::fopen(temporary.c_str(), "wb");
  if (f == nullptr) return make_error("cannot write " + temporary + ": " + std::strerror(errno), 1);
  std::array<std::int32_t, 256> header{};
  header[0] = kTokenFileMagic;
  header[1] = 1;
  header[3] = static_cast<std::int32_t>(vocab);
  if (std::fwrite(header.data(), sizeof header, 1, f) != 1) {
    std::fclose(f);
    return make_error("cannot write " + temporary + ": " + std::strerror(errno), 1);
  }
  return TokenFileWriter(path, f, vocab);
}

Status TokenFileWriter::append(std::span<const std::int32_t> tokens) {
  if (count_ + static_cast<std::int64_t>(tokens.size()) > std::numeric_limits<std::int32_t>::max())
    return make_error(path_ + ": more than 2^31-1 tokens (header[2] is an int32)");
  buffer_.resize(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_)
      return make_error(path_ + ": token " + std::to_string(tokens[i]) +
                        " outside the vocabulary of " + std::to_string(vocab_));
    buffer_[i] = static_cast<std::uint16_t>(tokens[i]);
  }
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 2, buffer_.size(), file_) != buffer_.size())
    return make_error("cannot write " + temporary_ + ": " + std::strerror(errno), 1);
  count_ += static_cast<std::int64_t>(tokens.size());
  return ok_status();
}

Status TokenFileWriter::finish() {
  const std::int32_t count = static_cast<std::int32_t>(count_);
  const bool written = std::fseek(file_, 8, SEEK_SET) == 0 &&
                       std::fwrite(&count, sizeof count, 1, file_) == 1 &&
                       std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!written || !closed || std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    std::remove(temporary_.c_str());
    return make_error("cannot write " + path_ + ": " + std::strerror(errno), 1);
  }
  return ok_status();
}

Result<Dataset> load_dataset(const jobspec::DataSpec& spec) {
  if (spec.kind == jobspec::DataKind::tokens) return load_token_file(spec.path, "data.path");
  if (spec.kind == jobspec::DataKind::janeaustenr) {
    auto text = decode_r_lazyload_text(spec.path);
    if (!text) return text.error();
    return char_level_dataset(*text, "janeaustenr " + spec.path);
  }
  auto text = read_text(spec.path);
  if (!text) return text.error();
  return char_level_dataset(*text, spec.path);
}

}  // namespace topolaunch::kernels
