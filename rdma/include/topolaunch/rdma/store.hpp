// The key-value exchange rdma needs: each rank publishes small binary blobs (UCX worker
// addresses, verbs QP info, rkeys) and reads its peers'. Same shape as the wireup module's
// KvStore (put/commit/fence/get); `wireup_store.hpp` adapts that one, and DirectoryStore is a
// real-but-local backend (files in one directory) for tests and single-node runs.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "topolaunch/topology/result.hpp"

namespace topolaunch::rdma {

class Store {
 public:
  virtual ~Store() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Publishes `bytes` (binary-safe) under (this rank, key); visible to others after commit().
  virtual Status put(const std::string& key, const std::string& bytes) = 0;
  virtual Status commit() = 0;
  // Returns when every rank has committed and entered the same fence, or fails after timeout.
  virtual Status fence(std::chrono::milliseconds timeout) = 0;
  // The value `rank` put under `key`; waits up to timeout for it to appear.
  virtual Result<std::string> get(int rank, const std::string& key,
                                  std::chrono::milliseconds timeout) = 0;
};

// Files under `directory` (which must exist and be shared by all ranks: one host, or a shared
// file system). Values are written to a temporary name and renamed, so a reader never sees a
// torn value.
Result<std::unique_ptr<Store>> make_directory_store(const std::string& directory, int rank,
                                                    int world_size);

}  // namespace topolaunch::rdma
