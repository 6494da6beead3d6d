// A cache of imported topology files: hwloc's import of a node's XML costs ~4 ms of CPU (a
// forked child, the parse, the JSON back), its cached import ~0.8 ms to read back. Used by the
// SPANK plugin (every node's file, in a root-only directory under slurmstepd) and by `topolaunch
// agent` (its own node's file, in a directory of the job user's).
//
// Layout under a cache directory (owned by the process's effective user, writable by no one
// else; created 0700 when missing, its parent must exist):
//   files/<key of salt + path>   the path, its stat signature (device, inode, size, mtime,
//                                ctime) when it was read, and the key of its bytes
//   topologies/<key>.json        the topology imported from those bytes, as lossless JSON
// The key of the bytes covers a salt (the caller's: the cache format, topolaunch's version, the
// JSON format, the NIC filter), so a changed file, filter or format never reads an old import.
// Entries are written to a temporary name and renamed, and a cached JSON is parsed before it is
// trusted: a cut or altered entry is imported again. Nothing is evicted.
#pragma once

#include <sys/stat.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/model.hpp"

namespace topolaunch::topology::import_cache {

inline constexpr std::string_view kFormat = "topolaunch-topology-cache 1";

// The salt of the keys: the cache format, topolaunch's version, the topology JSON format and
// the NIC filter's text (rdma.nics, the plugin's nics=).
std::string salt(std::string_view nics_text);

// A regular file's bytes (opened non-blocking and checked with fstat: a FIFO or a device in its
// place would block or never end); nullopt with errno set otherwise. Plain system calls: the
// plugin calls this in a child forked from slurmstepd.
std::optional<std::string> read_regular_file(const std::string& path, int extra_open_flags = 0);

// A topology file's bytes; when it cannot be read, the direct loader's words naming it.
Result<std::string> topology_file_bytes(const std::string& path);

// Written to a temporary name (with this host's name and pid: the directory may be shared by
// nodes) and renamed: a reader sees the whole entry or none.
Status write_entry(const std::string& dir, const std::string& name, std::string_view bytes);

// content_digest (common/digest.hpp): the inputs are the site's or the user's own files in a
// directory only they write, so the key needs no resistance to a forger, only to chance.
std::string key_of(std::string_view bytes);

std::string stat_signature(const struct stat& st);

// A directory the cache may trust: a real directory (not a link) of the effective user that
// no one else can write; created 0700 when missing. Checks `root` and its two subdirectories.
Status trusted_cache_directory(const std::string& root);

struct Lookup {
  std::string key;          // of the bytes (with the salt)
  std::string json;         // the import, lossless JSON (in `known` instead, when given)
  bool from_cache = false;  // the index entry matched the file's stat signature
  bool imported = false;    // `import` ran (new or changed bytes)
  std::string write_error;  // an entry could not be written (the result stands)
  // The topology when this call parsed or imported it (not when `known` already held its JSON):
  // a caller that wants the object need not parse the JSON again.
  std::optional<NodeTopology> topology;
};

// One file through the cache under `root` (trusted_cache_directory first). `import` turns the
// file's bytes into a topology when no cached import of them exists. `known` (optional) holds
// the JSON already read by the caller, by key, and receives this one's (then `json` stays empty:
// at 1,024 nodes of a few types, one copy per type).
Result<Lookup> lookup(const std::string& root, const std::string& path, const std::string& salt,
                      const std::function<Result<NodeTopology>(const std::string& bytes)>& import,
                      std::map<std::string, std::string>* known = nullptr);

}  // namespace topolaunch::topology::import_cache
