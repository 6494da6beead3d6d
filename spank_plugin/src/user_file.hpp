// Reading a file the user named, with the user's identity, never root's: slurmstepd runs the
// plugin as root, so an open() there would let any user read /root or /etc/shadow.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"

namespace topolaunch::spank {

inline constexpr std::size_t kMaxUserFileBytes = 1 << 20;

struct UserIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups
};

// When this process already runs with the user's effective ids (user_init), the file is opened
// directly; otherwise a child process drops to the user (setgroups/setgid/setuid) and sends the
// bytes back through a pipe. Errors name the path and the errno text.
Result<std::string> read_file_as_user(const std::string& path, const UserIdentity& user);

}  // namespace topolaunch::spank
