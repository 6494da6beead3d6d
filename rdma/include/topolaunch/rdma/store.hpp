// A local backend of the wireup KvStore for tests and single-node runs: one file per key in a
// directory shared by all ranks (one host, or a shared file system). Values are written to a
// temporary name and renamed, so a reader never sees a torn value. Multi-node jobs use the
// wireup module's TCP store or PMIx; rdma code only ever sees wireup::KvStore.
#pragma once

#include <memory>
#include <string>

#include "topolaunch/common/result.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::rdma {

// `directory` must exist. Fences are files too, so every rank must use the same directory.
Result<std::unique_ptr<wireup::KvStore>> make_directory_store(const std::string& directory,
                                                              int rank, int world_size);

}  // namespace topolaunch::rdma
