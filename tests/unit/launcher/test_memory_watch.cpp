// The memory watch's pure parts: a rank's process tree, GPU bytes per tree, NVML absent.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

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

namespace {

// A fake /proc: stat files and, when `with_children`, task/<tid>/children files.
struct FakeProc {
  std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("fake-proc-" + std::to_string(::getpid()));
  explicit FakeProc(bool with_children) {
    std::filesystem::remove_all(root);
    // 1 = the agent; 10 a worker (thread 12 too) with child 11 ("c (x)": parentheses in comm);
    // 20 an orphan of 10's group reparented to the agent; 99 not below the agent.
    add(1, "1 (agent) S 0 1 1", {{1, "10 20"}}, with_children);
    add(10, "10 (w) S 1 10 10", {{10, "11 "}, {12, ""}}, with_children);
    add(11, "11 (c (x)) S 10 11 11", {{11, ""}}, with_children);
    add(20, "20 (o) S 1 10 10", {{20, ""}}, with_children);
    add(99, "99 (other) S 0 99 99", {{99, ""}}, with_children);
  }
  ~FakeProc() { std::filesystem::remove_all(root); }
  void add(int pid, const std::string& stat, const std::vector<std::pair<int, std::string>>& tasks,
           bool with_children) {
    const auto dir = root / std::to_string(pid);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "stat") << stat << "\n";
    for (const auto& [tid, children] : tasks) {
      std::filesystem::create_directories(dir / "task" / std::to_string(tid));
      if (with_children) std::ofstream(dir / "task" / std::to_string(tid) / "children") << children;
    }
  }
};

std::vector<pid_t> pids_of(const std::vector<ProcessEntry>& table) {
  std::vector<pid_t> pids;
  for (const auto& e : table) pids.push_back(e.pid);
  std::sort(pids.begin(), pids.end());
  return pids;
}

}  // namespace

TEST_CASE("the agent's subtree through children files, the whole table without them") {
  {
    FakeProc proc(true);
    const auto subtree = read_process_subtree(1, proc.root.string());
    CHECK(pids_of(subtree) == std::vector<pid_t>{1, 10, 11, 20});
    CHECK(process_tree(10, subtree) == std::vector<pid_t>{10, 11, 20});
  }
  {
    FakeProc proc(false);
    const auto table = read_process_subtree(1, proc.root.string());
    CHECK(pids_of(table) == std::vector<pid_t>{1, 10, 11, 20, 99});
    CHECK(process_tree(10, table) == std::vector<pid_t>{10, 11, 20});
  }
}
