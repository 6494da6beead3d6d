// The memory watch's pure parts: a rank's process tree, GPU bytes per tree, NVML absent.
#include <unistd.h>

#include "catch.hpp"
#include "topolaunch/launcher/memory_watch.hpp"

using namespace topolaunch::launcher;

TEST_CASE("a rank's tree: descendants and its process group") {
  // 100 is the worker (a group leader). 101 its child, 102 a grandchild in a new group, 103 a
  // grandchild orphaned to the agent (ppid 50) but still in group 100, 200 someone else.
  const std::vector<ProcessEntry> table{{50, 1, 50},     {100, 50, 100}, {101, 100, 100},
                                        {102, 101, 102}, {103, 50, 100}, {200, 50, 200},
                                        {201, 200, 200}};
  CHECK(process_tree(100, table) == std::vector<pid_t>{100, 101, 102, 103});
  CHECK(process_tree(200, table) == std::vector<pid_t>{200, 201});
  CHECK(process_tree(999, table).empty());  // gone
}

TEST_CASE("this process is found in /proc with its parent") {
  const auto table = read_process_table();
  const pid_t self = ::getpid();
  bool found = false;
  for (const auto& e : table) {
    if (e.pid == self) {
      found = true;
      CHECK(e.ppid == ::getppid());
      CHECK(e.pgid == ::getpgrp());
    }
  }
  CHECK(found);
  CHECK(rss_bytes_of(self) > 0);
  CHECK(pss_bytes_of(self) > 0);
  CHECK(tree_memory_bytes({self}) > 0);
}

TEST_CASE("GPU bytes of a tree, per device") {
  const std::vector<GpuProcessMemory> usage{
      {0, 100, 1000}, {1, 101, 2000}, {1, 100, 500}, {0, 300, 7000}};
  const auto bytes = gpu_bytes_of_tree(usage, {100, 101});
  CHECK(bytes == std::map<int, std::uint64_t>{{0, 1000}, {1, 2500}});
  CHECK(gpu_bytes_of_tree(usage, {555}).empty());
}

TEST_CASE("NVML absent is an error that names the library") {
  auto watch = NvmlMemoryWatch::open("/nonexistent/libnvidia-ml.so.1");
  REQUIRE(!watch);
  CHECK(watch.error().message.find("/nonexistent/libnvidia-ml.so.1") != std::string::npos);
}
