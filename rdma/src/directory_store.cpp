// A wireup::KvStore over files in one directory. Keys map to file names (bytes outside
// [A-Za-z0-9._-] are hex-escaped); fence number n of rank r creates "fence.<n>.<r>" and waits
// until all ranks' files exist, naming the ranks that did not arrive.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "topolaunch/rdma/store.hpp"

namespace topolaunch::rdma {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string file_name_for(std::string_view key) {
  static const char* hex = "0123456789abcdef";
  std::string out = "v.";
  for (unsigned char c : key) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_' || c == '.';
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

class DirectoryStore final : public wireup::KvStore {
 public:
  DirectoryStore(fs::path dir, int rank, int world)
      : dir_(std::move(dir)), rank_(rank), world_(world) {}

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string_view backend() const override { return "directory"; }

  using wireup::KvStore::put;
  Status put(std::string_view key, std::span<const std::byte> value) override {
    if (key.empty() || key.size() > 150)
      return make_error("directory store: key must be 1..150 bytes, got " +
                        std::to_string(key.size()));
    pending_.emplace_back(std::string(key),
                          std::string(reinterpret_cast<const char*>(value.data()), value.size()));
    return ok_status();
  }

  Status commit() override {
    for (auto& [key, bytes] : pending_) {
      const fs::path final_path = dir_ / file_name_for(key);
      const fs::path tmp = dir_ / (".tmp." + std::to_string(rank_) + "." + file_name_for(key));
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        out.flush();
        if (!out)
          return make_error(
              "directory store: cannot write " + tmp.string() + ": " + std::strerror(errno), 1);
      }
      std::error_code ec;
      fs::rename(tmp, final_path, ec);
      if (ec)
        return make_error("directory store: cannot rename " + tmp.string() + ": " + ec.message(),
                          1);
    }
    pending_.clear();
    return ok_status();
  }

  Status fence(milliseconds timeout) override {
    if (auto st = commit(); !st) return st;
    const int n = fence_count_++;
    auto fence_file = [&](int r) {
      return dir_ / ("fence." + std::to_string(n) + "." + std::to_string(r));
    };
    {
      std::ofstream out(fence_file(rank_));
      if (!out) return make_error("directory store: cannot write " + fence_file(rank_).string(), 1);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      std::vector<int> missing;
      for (int r = 0; r < world_; ++r)
        if (!fs::exists(fence_file(r))) missing.push_back(r);
      if (missing.empty()) return ok_status();
      if (std::chrono::steady_clock::now() > deadline) {
        std::string names;
        for (int r : missing) names += (names.empty() ? "" : ",") + std::to_string(r);
        return make_error("directory store: fence " + std::to_string(n) + " timed out after " +
                              std::to_string(timeout.count()) + " ms; ranks not arrived: " + names +
                              " (did they start? did they crash?)",
                          1);
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
  }

  Result<wireup::Bytes> get(std::string_view key, milliseconds timeout) override {
    const fs::path p = dir_ / file_name_for(key);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      std::ifstream in(p, std::ios::binary);
      if (in) {
        std::ostringstream ss;
        ss << in.rdbuf();
        const std::string s = ss.str();
        wireup::Bytes out(s.size());
        std::memcpy(out.data(), s.data(), s.size());
        return out;
      }
      if (std::chrono::steady_clock::now() > deadline)
        return make_error("directory store: key \"" + std::string(key) +
                              "\" not published within " + std::to_string(timeout.count()) + " ms",
                          1);
      std::this_thread::sleep_for(milliseconds(1));
    }
  }

 private:
  fs::path dir_;
  int rank_;
  int world_;
  int fence_count_ = 0;
  std::vector<std::pair<std::string, std::string>> pending_;
};

}  // namespace

Result<std::unique_ptr<wireup::KvStore>> make_directory_store(const std::string& directory,
                                                              int rank, int world_size) {
  if (world_size < 1)
    return make_error("directory store: world size must be >= 1, got " +
                      std::to_string(world_size));
  if (rank < 0 || rank >= world_size)
    return make_error("directory store: rank " + std::to_string(rank) + " not in 0.." +
                      std::to_string(world_size - 1));
  std::error_code ec;
  if (!fs::is_directory(directory, ec))
    return make_error("directory store: " + directory + " is not a directory (create it first)");
  return std::unique_ptr<wireup::KvStore>(
      std::make_unique<DirectoryStore>(directory, rank, world_size));
}

}  // namespace topolaunch::rdma
