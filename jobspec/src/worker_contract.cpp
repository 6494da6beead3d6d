#include "topolaunch/jobspec/worker_contract.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

namespace topolaunch::jobspec {
namespace {

// Ours where set, else torchrun's; both are checked when both are set.
Result<int> place_value(const Environment& env, const char* ours, const char* torchrun, int absent,
                        int min) {
  auto theirs = env_int(env, torchrun, absent, min);
  if (!theirs) return theirs.error();
  return env_int(env, ours, *theirs, min);
}

}  // namespace

Result<WorkerPlace> worker_place(const Environment& env) {
  WorkerPlace place;
  auto world = place_value(env, env::kTopolaunchWorldSize, env::kWorldSize, 1, 1);
  if (!world) return world.error();
  auto rank = place_value(env, env::kTopolaunchRank, env::kRank, 0, 0);
  if (!rank) return rank.error();
  auto local = place_value(env, env::kTopolaunchLocalRank, env::kLocalRank, 0, 0);
  if (!local) return local.error();
  if (*rank >= *world) {
    const bool ours = env_value(env, env::kTopolaunchRank).has_value();
    return make_error(
        std::string(ours ? env::kTopolaunchRank : env::kRank) + "=" + std::to_string(*rank) +
        ": not below " +
        (env_value(env, env::kTopolaunchWorldSize) ? env::kTopolaunchWorldSize : env::kWorldSize) +
        "=" + std::to_string(*world) + " (set both, or start the worker with topolaunch run)");
  }
  place.world_size = *world;
  place.rank = *rank;
  place.local_rank = *local;
  return place;
}

HeartbeatWriter::HeartbeatWriter() {
  const char* path = std::getenv(env::kHeartbeatFile);
  if (path != nullptr && *path != '\0') fd_ = ::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
}

HeartbeatWriter::HeartbeatWriter(const std::string& path)
    : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) {}

HeartbeatWriter::~HeartbeatWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void HeartbeatWriter::beat(std::uint64_t counter) {
  if (fd_ < 0) return;
  char digits[20];
  int d = 0;
  do {
    digits[d++] = static_cast<char>('0' + counter % 10);
    counter /= 10;
  } while (counter != 0);
  char text[21];
  int n = 0;
  while (d > 0) text[n++] = digits[--d];
  text[n++] = '\n';
  // As long or longer than before while the counter only grows: no truncation needed.
  (void)!::pwrite(fd_, text, static_cast<std::size_t>(n), 0);
}

}  // namespace topolaunch::jobspec
