#include "topolaunch/topology/import_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "topolaunch/common/digest.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/serialize.hpp"

#ifndef TOPOLAUNCH_VERSION
#error "TOPOLAUNCH_VERSION: set by meson"
#endif

namespace topolaunch::topology::import_cache {
namespace {

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

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "host";
  return name;
}

}  // namespace

std::string salt(std::string_view nics_text) {
  return fmt::format("{}\ntopolaunch {}\njson {}\nnics {}\n", kFormat, TOPOLAUNCH_VERSION,
                     kTopologyJsonVersion, nics_text);
}

std::optional<std::string> read_regular_file(const std::string& path, int extra_open_flags) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_open_flags);
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

Result<std::string> topology_file_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    return make_error(path + ": not a regular file, expected an hwloc xml or topology json file");
  }
  if (auto bytes = read_regular_file(path)) return std::move(*bytes);
  auto direct = load_topology_file(path);
  return make_error(direct ? "cannot read topology file " + path : direct.error().message);
}

Status write_entry(const std::string& dir, const std::string& name, std::string_view bytes) {
  static const std::string host = host_name();
  const std::string final_path = dir + "/" + name;
  const std::string temporary =
      fmt::format("{}/.{}.{}.{}", dir, name, host, static_cast<long>(::getpid()));
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

std::string key_of(std::string_view bytes) { return content_digest(bytes); }

std::string stat_signature(const struct stat& st) {
  return fmt::format("{} {} {} {}.{:09} {}.{:09}", st.st_dev, st.st_ino, st.st_size,
                     st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
}

Status trusted_cache_directory(const std::string& root) {
  for (const std::string& dir : {root, root + "/files", root + "/topologies"}) {
    if (auto trusted = trusted_directory(dir); !trusted) return trusted;
  }
  return ok_status();
}

Result<Lookup> lookup(const std::string& root, const std::string& path, const std::string& salt,
                      const std::function<Result<NodeTopology>(const std::string& bytes)>& import,
                      std::map<std::string, std::string>* known) {
  std::map<std::string, std::string> local;
  std::map<std::string, std::string>& json_by_key = known ? *known : local;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return topology_file_bytes(path).error();
  }
  const std::string signature = stat_signature(st);
  // Named by the salt too: an entry written under another NIC filter or version points at an
  // import of those, and must not be found under this one.
  const std::string index_name = key_of(salt + path);
  Lookup out;
  // The index entry: format, path, signature, key.
  if (auto entry = read_regular_file(root + "/files/" + index_name, O_NOFOLLOW)) {
    const std::string expected = fmt::format("{}\n{}\n{}\n", kFormat, path, signature);
    if (entry->size() == expected.size() + 33 && entry->starts_with(expected) &&
        entry->back() == '\n') {
      out.key = entry->substr(expected.size(), 32);
    }
  }
  auto cached_import = [&](const std::string& candidate) {
    if (json_by_key.contains(candidate)) return true;
    auto json = read_regular_file(root + "/topologies/" + candidate + ".json", O_NOFOLLOW);
    if (!json) return false;
    auto parsed = from_json(*json, candidate);
    if (!parsed) return false;
    out.topology = std::move(*parsed);  // parsed once, to check it: the caller may keep it
    json_by_key.emplace(candidate, std::move(*json));
    return true;
  };
  if (!out.key.empty() && cached_import(out.key)) {
    out.from_cache = true;
  } else {
    auto bytes = topology_file_bytes(path);
    if (!bytes) return bytes.error();
    out.key = key_of(salt + *bytes);
    if (!cached_import(out.key)) {
      auto topo = import(*bytes);
      if (!topo) return topo.error();
      std::string json = to_json(*topo);
      out.topology = std::move(*topo);
      if (auto ok = write_entry(root + "/topologies", out.key + ".json", json); !ok)
        out.write_error = ok.error().message;
      json_by_key.emplace(out.key, std::move(json));
      out.imported = true;
    }
    const std::string entry = fmt::format("{}\n{}\n{}\n{}\n", kFormat, path, signature, out.key);
    if (auto ok = write_entry(root + "/files", index_name, entry); !ok && out.write_error.empty())
      out.write_error = ok.error().message;
  }
  if (!known) out.json = std::move(local.at(out.key));
  return out;
}

}  // namespace topolaunch::topology::import_cache
