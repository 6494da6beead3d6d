// Where the job's cgroup goes: this process's cgroup v2 directory from /proc/self/cgroup and
// /proc/self/mountinfo as a host, a hybrid host and a container show them; Slurm's step cgroups.
#include "catch.hpp"
#include "containment.hpp"

using namespace topolaunch::launcher;

namespace {

constexpr const char* kUnifiedHost =
    "25 1 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
    "26 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n";

// systemd's hybrid layout: v1 controllers, the v2 hierarchy at .../unified.
constexpr const char* kHybridHost =
    "30 24 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "31 30 0:27 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

// A container that sees its own subtree mounted at /sys/fs/cgroup (no cgroup namespace).
constexpr const char* kContainer =
    "600 590 0:23 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n";

}  // namespace

TEST_CASE("cgroup v2 directory: the mount point joined with the 0:: path") {
  CHECK(cgroup2_directory("0::/user.slice/session-3.scope\n", kUnifiedHost) ==
        "/sys/fs/cgroup/user.slice/session-3.scope");
  CHECK(cgroup2_directory("0::/\n", kUnifiedHost) == "/sys/fs/cgroup");
}

TEST_CASE("cgroup v2 directory: a hybrid host's unified hierarchy, beside v1 lines") {
  CHECK(cgroup2_directory("4:memory:/process_api/9102\n1:cpu:/\n0::/\n", kHybridHost) ==
        "/sys/fs/cgroup/unified");
}

TEST_CASE("cgroup v2 directory: a mount of a subtree takes its root off the path") {
  CHECK(cgroup2_directory("0::/docker/abc/app\n", kContainer) == "/sys/fs/cgroup/app");
  CHECK(cgroup2_directory("0::/docker/abc\n", kContainer) == "/sys/fs/cgroup");
  CHECK_FALSE(cgroup2_directory("0::/elsewhere\n", kContainer));  // not below the mount's root
}

TEST_CASE("cgroup v2 directory: none without a cgroup2 mount or a 0:: line") {
  CHECK_FALSE(cgroup2_directory("0::/\n", "26 1 8:1 / / rw - ext4 /dev/sda1 rw\n"));
  CHECK_FALSE(cgroup2_directory("4:memory:/x\n", kHybridHost));
}

TEST_CASE("cgroup v2 directory: escaped mount points") {
  CHECK(cgroup2_directory("0::/a\n", "25 1 0:23 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n") ==
        "/mnt/cg two/a");
}

TEST_CASE("Slurm step cgroups, v1 and v2, of this job only") {
  CHECK(in_slurm_step_cgroup("4:freezer:/slurm/uid_0/job_1001/step_0\n0::/\n", "1001"));
  CHECK(in_slurm_step_cgroup("0::/system.slice/slurmstepd.scope/job_1001/step_batch/user/task_0\n",
                             "1001"));
  CHECK_FALSE(in_slurm_step_cgroup("4:freezer:/slurm/uid_0/job_10010/step_0\n", "1001"));
  CHECK_FALSE(in_slurm_step_cgroup("0::/user.slice\n", "1001"));
  CHECK_FALSE(in_slurm_step_cgroup("4:freezer:/slurm/uid_0/job_1001/step_0\n", ""));
}

TEST_CASE("the job's cgroup is named after topolaunch's pid and the run id, cleaned") {
  CHECK(cgroup_name(42, "tiny-gpt-20261202-101500-ab12") ==
        "topolaunch.42.tiny-gpt-20261202-101500-ab12");
  CHECK(cgroup_name(42, "a/b\nc") == "topolaunch.42.a_b_c");
  CHECK(cgroup_name(42, "") == "topolaunch.42");
}
