// DirectoryStore: one file per (rank, key) in a directory shared by all ranks. Writers write a
// temporary file and rename it (atomic on POSIX), readers poll. Fences are counted files:
// fence number n of rank r creates "fence.<n>.<r>" and waits until all ranks' files exist.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "topolaunch/rdma/store.hpp"

namespace topolaunch::rdma {
namespace {

namespace fs = std::filesystem;

bool valid_key(const std::string& key) {
  if (key.empty() || key.size() > 200) return false;
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

class DirectoryStore final : public Store {
 public:
  DirectoryStore(fs::path dir, int rank, int world)
      : dir_(std::move(dir)), rank_(rank), world_(world) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  Status put(const std::string& key, const std::string& bytes) override {
    if (!valid_key(key))
      return make_error("store: invalid key \"" + key + "\" (use [A-Za-z0-9._-])");
    pending_.emplace_back(key, bytes);
    return ok_status();
  }

  Status commit() override {
    for (auto& [key, bytes] : pending_) {
      fs::path final_path = dir_ / value_name(rank_, key);
      fs::path tmp = dir_ / (".tmp." + std::to_string(rank_) + "." + key);
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        out.flush();
        if (!out)
          return make_error("store: cannot write " + tmp.string() + ": " + std::strerror(errno), 1);
      }
      std::error_code ec;
      fs::rename(tmp, final_path, ec);
      if (ec) return make_error("store: cannot rename " + tmp.string() + ": " + ec.message(), 1);
    }
    pending_.clear();
    return ok_status();
  }

  Status fence(std::chrono::milliseconds timeout) override {
    if (auto st = commit(); !st) return st;
    const int n = fence_count_++;
    const std::string mine = "fence." + std::to_string(n) + "." + std::to_string(rank_);
    {
      std::ofstream out(dir_ / mine);
      if (!out) return make_error("store: cannot write " + (dir_ / mine).string(), 1);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int r = 0; r < world_; ++r) {
      const fs::path p = dir_ / ("fence." + std::to_string(n) + "." + std::to_string(r));
      while (!fs::exists(p)) {
        if (std::chrono::steady_clock::now() > deadline)
          return make_error("store: fence " + std::to_string(n) + " timed out after " +
                                std::to_string(timeout.count()) + " ms waiting for rank " +
                                std::to_string(r) + " (is it running?)",
                            1);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    return ok_status();
  }

  Result<std::string> get(int rank, const std::string& key,
                          std::chrono::milliseconds timeout) override {
    if (rank < 0 || rank >= world_)
      return make_error("store: rank " + std::to_string(rank) + " out of range 0.." +
                        std::to_string(world_ - 1));
    if (!valid_key(key)) return make_error("store: invalid key \"" + key + "\"");
    const fs::path p = dir_ / value_name(rank, key);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      std::ifstream in(p, std::ios::binary);
      if (in) {
        std::ostringstream ss;
        ss << in.rdbuf();
        return ss.str();
      }
      if (std::chrono::steady_clock::now() > deadline)
        return make_error("store: key \"" + key + "\" of rank " + std::to_string(rank) +
                              " not published within " + std::to_string(timeout.count()) + " ms",
                          1);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  static std::string value_name(int rank, const std::string& key) {
    return "v." + std::to_string(rank) + "." + key;
  }
  fs::path dir_;
  int rank_;
  int world_;
  int fence_count_ = 0;
  std::vector<std::pair<std::string, std::string>> pending_;
};

}  // namespace

Result<std::unique_ptr<Store>> make_directory_store(const std::string& directory, int rank,
                                                    int world_size) {
  if (world_size < 1)
    return make_error("store: world size must be >= 1, got " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size)
    return make_error("store: rank " + std::to_string(rank) + " not in 0.." +
                      std::to_string(world_size - 1));
  std::error_code ec;
  if (!fs::is_directory(directory, ec))
    return make_error("store: " + directory + " is not a directory (create it first)");
  return std::unique_ptr<Store>(std::make_unique<DirectoryStore>(directory, rank, world_size));
}

}  // namespace topolaunch::rdma
