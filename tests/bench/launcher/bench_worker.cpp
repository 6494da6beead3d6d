// The benchmark's worker: records when it started (CLOCK_REALTIME, ns) and exits at once, so the
// launchers' own costs are what is measured; with BENCH_LINGER_MS it stays that long first (as a
// training worker would: the early workers' exit then does not run beside the late ones' start).
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const char* dir = std::getenv("BENCH_STARTS_DIR");
  if (dir == nullptr) return 2;
  std::string path = std::string(dir) + "/start-" + std::to_string(getpid());
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return 3;
  std::fprintf(f, "%lld\n", static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
  std::fclose(f);
  if (const char* linger = std::getenv("BENCH_LINGER_MS"); linger != nullptr)
    usleep(static_cast<useconds_t>(std::atoi(linger)) * 1000);
  return 0;
}
