#include "topology_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include "topolaunch/common/isolated.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/serialize.hpp"

#ifndef TOPOLAUNCH_VERSION
#error "TOPOLAUNCH_VERSION: set by meson"
#endif

namespace topolaunch::spank {
namespace {

using topology::NodeTopology;

constexpr std::string_view kFormat = "topolaunch-topology-cache 1";
constexpr std::size_t kMaxOutputBytes = 512u << 20;

// The child runs inside slurmstepd's address space after fork: plain system calls for its files
// (no iostreams or stdio, whose locks another thread may have held at the fork).
// Regular files only: a FIFO or a device in the cache's place would block or never end.
std::optional<std::string> read_all(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | flags);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    errno = EINVAL;
    return std::nullopt;
  }
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

// A node file's bytes; when it cannot be read, the direct loader's own words naming it (a
// missing file, a directory). Anything else not regular is refused before an open could block.
Result<std::string> node_file_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    return make_error(path + ": not a regular file, expected an hwloc xml or topology json file");
  }
  if (auto bytes = read_all(path, 0)) return std::move(*bytes);
  auto direct = topology::load_topology_file(path);
  return make_error(direct ? "cannot read topology file " + path : direct.error().message);
}

// Written to a temporary name and renamed: a reader sees the whole entry or none.
Status write_entry(const std::string& dir, const std::string& name, std::string_view bytes) {
  const std::string final_path = dir + "/" + name;
  const std::string temporary = dir + "/." + name + "." + std::to_string(::getpid());
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(fmt::format("{}: {}", temporary, std::strerror(errno)));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      return make_error(fmt::format("{}: {}", temporary, std::strerror(saved)));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(temporary.c_str(), final_path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temporary.c_str());
    return make_error(fmt::format("{}: {}", final_path, std::strerror(saved)));
  }
  return ok_status();
}

// 128 bits of FNV-1a (two bases). The cache's inputs are the site's own files under a directory
// only root writes, so the key needs no resistance to a forger, only to chance: at the few
// thousand distinct files a site has, a collision by chance is below 1e-30.
std::string key_of(std::string_view bytes) {
  auto fnv = [&](std::uint64_t hash) {
    for (const unsigned char c : bytes) {
      hash ^= c;
      hash *= 0x100000001b3ULL;
    }
    return hash;
  };
  return fmt::format("{:016x}{:016x}", fnv(0xcbf29ce484222325ULL),
                     fnv(0x6c62272e07bb0142ULL ^ bytes.size()));
}

std::string signature_of(const struct stat& st) {
  return fmt::format("{} {} {} {}.{:09} {}.{:09}", st.st_dev, st.st_ino, st.st_size,
                     st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
}

// A directory the cache may trust: a real directory (not a link) of this identity that no one
// else can write. Created when missing (its parent must exist).
Status trusted_directory(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) {
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
      return make_error(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
    }
  }
  if (::lstat(path.c_str(), &st) != 0) {
    return make_error(fmt::format("{}: {}", path, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return make_error(fmt::format("{} is not a directory", path));
  if (st.st_uid != ::geteuid()) {
    return make_error(
        fmt::format("{} belongs to uid {}, not to uid {}", path, st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & 022) != 0) {
    return make_error(
        fmt::format("{} is writable by group or others (mode {:o})", path, st.st_mode & 07777));
  }
  return ok_status();
}

// What the child sends back, one record per line; a topology as its length and its bytes:
//   U <why>                       the cache cannot be used (the only record)
//   E <message>                   a node's file cannot be read or imported (the only record)
//   N <node> <key>                per node
//   T <key> <length>\n<json>      per distinct key
//   C <from cache> <imported>
//   W <why>                       an entry could not be written (the results stand)
Result<std::string> cache_child(const SiteConfig& site, const std::vector<std::string>& nodes) {
  // slurmstepd's user_init runs with the job user's effective ids and the real uid 0: the cache
  // is root's. Elsewhere (tests, a user's own slurmd) real and effective ids are the same.
  const uid_t job_uid = ::geteuid();
  const gid_t job_gid = ::getegid();
  if (job_gid != ::getgid() || job_uid != ::getuid()) {
    if (::seteuid(::getuid()) != 0 || ::setegid(::getgid()) != 0) {
      return fmt::format("U cannot take the real identity (uid {}): {}\n", ::getuid(),
                         std::strerror(errno));
    }
  }
  // hwloc parses with the identity it had before the cache (the job user's under slurmstepd);
  // only the cache's own files are read and written with the real one. This child is single
  // threaded, so switching back and forth affects nothing else.
  auto import_as_job_user =
      [&](const std::string& bytes, const std::string& path,
          const topology::DiscoverOptions& options) -> Result<topology::NodeTopology> {
    const bool switched = job_uid != ::geteuid() || job_gid != ::getegid();
    if (switched && (::setegid(job_gid) != 0 || ::seteuid(job_uid) != 0)) {
      return make_error(fmt::format("cannot switch to uid {} to import {}: {}", job_uid, path,
                                    std::strerror(errno)));
    }
    auto topo = topology::load_topology_buffer(bytes, path, options);
    if (switched && (::seteuid(::getuid()) != 0 || ::setegid(::getgid()) != 0)) {
      return make_error(
          fmt::format("cannot switch back to uid {}: {}", ::getuid(), std::strerror(errno)));
    }
    return topo;
  };
  const std::string& root = site.topology_cache;
  for (const std::string& dir : {root, root + "/files", root + "/topologies"}) {
    if (auto trusted = trusted_directory(dir); !trusted) {
      return "U " + trusted.error().message + "\n";
    }
  }
  const std::string salt =
      fmt::format("{}\ntopolaunch {}\njson {}\nnics {}\n", kFormat, TOPOLAUNCH_VERSION,
                  topology::kTopologyJsonVersion, site.nics_text);
  topology::DiscoverOptions options;
  options.nics = site.nics;

  std::string nodes_out;
  std::map<std::string, std::string> json_by_key;
  std::string written;  // the first write failure, if any
  int from_cache = 0;
  int imported = 0;
  for (const std::string& node : nodes) {
    const std::string path = expand_node_pattern(site.topology_xml, node);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return "E " + node_file_bytes(path).error().message + "\n";
    }
    const std::string signature = signature_of(st);
    const std::string index_name = key_of(path);
    std::string key;
    // The index entry: format, path, signature, key.
    if (auto entry = read_all(root + "/files/" + index_name, O_NOFOLLOW)) {
      const std::string expected = fmt::format("{}\n{}\n{}\n", kFormat, path, signature);
      if (entry->size() == expected.size() + 33 && entry->starts_with(expected) &&
          entry->back() == '\n') {
        key = entry->substr(expected.size(), 32);
      }
    }
    // A cached import is parsed once here before it is trusted: a cut or altered entry is
    // imported again from the file, not handed to the plan.
    auto cached_import = [&](const std::string& candidate) {
      if (json_by_key.contains(candidate)) return true;
      auto json = read_all(root + "/topologies/" + candidate + ".json", O_NOFOLLOW);
      if (!json || !topology::from_json(*json, candidate)) return false;
      json_by_key.emplace(candidate, std::move(*json));
      return true;
    };
    if (!key.empty() && !cached_import(key)) key.clear();
    if (key.empty()) {
      auto bytes = node_file_bytes(path);
      if (!bytes) return "E " + bytes.error().message + "\n";
      key = key_of(salt + *bytes);
      if (!cached_import(key)) {
        auto topo = import_as_job_user(*bytes, path, options);
        if (!topo) return "E " + topo.error().message + "\n";
        std::string json = topology::to_json(*topo);
        if (auto ok = write_entry(root + "/topologies", key + ".json", json);
            !ok && written.empty())
          written = ok.error().message;
        json_by_key.emplace(key, std::move(json));
        ++imported;
      }
      const std::string entry = fmt::format("{}\n{}\n{}\n{}\n", kFormat, path, signature, key);
      if (auto ok = write_entry(root + "/files", index_name, entry); !ok && written.empty())
        written = ok.error().message;
    } else {
      ++from_cache;
    }
    nodes_out += fmt::format("N {} {}\n", node, key);
  }
  std::string out = std::move(nodes_out);
  for (const auto& [key, json] : json_by_key) {
    out += fmt::format("T {} {}\n", key, json.size());
    out += json;
  }
  out += fmt::format("C {} {}\n", from_cache, imported);
  if (!written.empty()) out += "W " + written + "\n";
  return out;
}

}  // namespace

Result<StepTopologies> load_step_topologies(const SiteConfig& site,
                                            const std::vector<std::string>& nodes,
                                            const std::string& self) {
  StepTopologies result;
  IsolationLimits limits;
  // The first step on a node imports every distinct file (24 ms each here); later ones import none.
  limits.wall = std::chrono::minutes(5);
  limits.cpu = std::chrono::minutes(5);
  auto text = run_isolated_output([&] { return cache_child(site, nodes); }, limits,
                                  "topology cache " + site.topology_cache, kMaxOutputBytes);
  if (!text) {
    result.unusable = text.error().message;
    return result;
  }
  const std::string_view all = *text;
  std::map<std::string, std::string> key_of_node;
  std::map<std::string, std::shared_ptr<const NodeTopology>> by_key;
  std::map<std::string, std::string> first_node_of_key;
  std::size_t at = 0;
  auto bad = [&](std::string_view why) -> Result<StepTopologies> {
    result = StepTopologies{};
    result.unusable = fmt::format("topology cache {}: {}", site.topology_cache, why);
    return result;
  };
  while (at < all.size()) {
    const std::size_t end = all.find('\n', at);
    if (end == std::string_view::npos) return bad("a cut reply");
    const std::string_view line = all.substr(at, end - at);
    at = end + 1;
    if (line.size() < 2 || line[1] != ' ') return bad("a malformed reply");
    const std::string_view rest = line.substr(2);
    const std::size_t space = rest.find(' ');
    switch (line[0]) {
      case 'U':
        return bad(rest);
      case 'E':
        return make_error(std::string(rest));
      case 'N': {
        if (space == std::string_view::npos) return bad("a malformed node record");
        const std::string node(rest.substr(0, space));
        key_of_node[node] = std::string(rest.substr(space + 1));
        first_node_of_key.try_emplace(std::string(rest.substr(space + 1)), node);
        break;
      }
      case 'T': {
        if (space == std::string_view::npos) return bad("a malformed topology record");
        const std::string key(rest.substr(0, space));
        const std::size_t length =
            std::strtoull(std::string(rest.substr(space + 1)).c_str(), nullptr, 10);
        if (length > all.size() - at) return bad("a cut topology record");
        const std::string json(all.substr(at, length));
        at += length;
        auto node = first_node_of_key.find(key);
        const std::string path = node == first_node_of_key.end()
                                     ? key
                                     : expand_node_pattern(site.topology_xml, node->second);
        auto topo = topology::from_json(json, path);
        if (!topo) return bad(topo.error().message);
        if (node != first_node_of_key.end()) topo->hostname = node->second;
        topo->sources.origin = path;
        by_key[key] = std::make_shared<const NodeTopology>(std::move(*topo));
        break;
      }
      case 'C':
        if (std::sscanf(std::string(rest).c_str(), "%d %d", &result.from_cache, &result.imported) !=
            2)
          return bad("a malformed count record");
        break;
      case 'W':
        result.write_error = std::string(rest);
        break;
      default:
        return bad("an unknown record");
    }
  }
  for (const std::string& node : nodes) {
    auto key = key_of_node.find(node);
    if (key == key_of_node.end()) return bad(fmt::format("no record of node {}", node));
    auto topo = by_key.find(key->second);
    if (topo == by_key.end()) return bad(fmt::format("no topology for node {}", node));
    if (node == self && topo->second->hostname != self) {
      // This node's own: its name and its file, in messages and the task environment.
      auto own = std::make_shared<NodeTopology>(*topo->second);
      own->hostname = self;
      own->sources.origin = expand_node_pattern(site.topology_xml, self);
      result.by_node[node] = std::move(own);
    } else {
      result.by_node[node] = topo->second;
    }
  }
  result.distinct = static_cast<int>(by_key.size());
  return result;
}

Result<StepTopologies> load_step_topologies_direct(const SiteConfig& site,
                                                   const std::vector<std::string>& nodes,
                                                   const std::string& self) {
  StepTopologies result;
  std::map<std::string, std::shared_ptr<const NodeTopology>> by_bytes;
  // This node first: its topology carries its own name, and nodes with the same bytes share it.
  std::vector<std::string> order{self};
  for (const std::string& node : nodes) {
    if (node != self) order.push_back(node);
  }
  for (const std::string& node : order) {
    const std::string path = expand_node_pattern(site.topology_xml, node);
    auto bytes = node_file_bytes(path);
    if (!bytes) return bytes.error();
    if (auto known = by_bytes.find(*bytes); known != by_bytes.end()) {
      result.by_node[node] = known->second;
      continue;
    }
    topology::DiscoverOptions options;
    options.nics = site.nics;
    options.hostname = node;
    auto topo = topology::load_topology_buffer(*bytes, path, options);
    if (!topo) return topo.error();
    auto shared = std::make_shared<const NodeTopology>(std::move(*topo));
    result.by_node[node] = shared;
    by_bytes.emplace(std::move(*bytes), std::move(shared));
    ++result.imported;
  }
  result.distinct = static_cast<int>(by_bytes.size());
  return result;
}

}  // namespace topolaunch::spank
