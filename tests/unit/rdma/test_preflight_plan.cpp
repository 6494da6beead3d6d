// plan_preflight: from job settings and a node's sysfs to one rank's preflight configuration.
// Bad input (a NIC named in the config that does not exist, only a down port) is an error with
// exit status 2 naming node, rank, NIC and port, before any process connects to another.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "catch.hpp"
#include "topolaunch/rdma/preflight.hpp"

using namespace topolaunch;
using namespace topolaunch::rdma;

namespace {

std::string sysfs_fixture(const std::string& name) {
  const char* dir = std::getenv("TOPOLAUNCH_FIXTURES_DIR");
  REQUIRE(dir != nullptr);  // set by meson's test_env
  return std::string(dir) + "/sysfs/" + name;
}

PreflightPlanInput input_for(const std::string& fixture, std::vector<std::string> nics) {
  PreflightPlanInput in;
  in.level = PreflightLevel::full;
  in.rank = 3;
  in.node = "gpu-node-07";
  in.nics = std::move(nics);
  in.sysfs_root = sysfs_fixture(fixture);
  in.probe_cuda = false;
  in.transport = "verbs";
  return in;
}

}  // namespace

TEST_CASE("plan_preflight: a NIC named in the config that does not exist is exit 2 naming it") {
  auto plan = plan_preflight(input_for("ndr-ib", {"mlx5_9"}));
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().exit_code == 2);
  const std::string& m = plan.error().message;
  CHECK(m.find("mlx5_9") != std::string::npos);
  CHECK(m.find("gpu-node-07") != std::string::npos);
  CHECK(m.find("rank 3") != std::string::npos);
  CHECK(m.find("mlx5_0") != std::string::npos);  // what does exist, to fix the config with
}

TEST_CASE("plan_preflight: a port number the NIC does not have is exit 2 naming NIC and port") {
  auto plan = plan_preflight(input_for("ndr-ib", {"mlx5_0:7"}));
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().exit_code == 2);
  CHECK(plan.error().message.find("mlx5_0 has no port 7") != std::string::npos);
}

TEST_CASE("plan_preflight: only a down port named is exit 2 naming the port and its state") {
  auto plan = plan_preflight(input_for("down-port", {"mlx5_1"}));
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().exit_code == 2);
  const std::string& m = plan.error().message;
  CHECK(m.find("mlx5_1:1") != std::string::npos);
  CHECK(m.find("DOWN") != std::string::npos);
  CHECK(m.find("gpu-node-07") != std::string::npos);
}

TEST_CASE("plan_preflight: a healthy named NIC gives the verbs device, port and UCX settings") {
  auto plan = plan_preflight(input_for("ndr-ib", {"mlx5_1"}));
  REQUIRE(plan.ok());
  CHECK(plan->transport == "verbs");
  CHECK(plan->verbs.device == "mlx5_1");
  CHECK(plan->verbs.port == 1);
  REQUIRE(plan->selected.has_value());
  CHECK(plan->selected->nic == "mlx5_1");
  CHECK(plan->ucx.net_devices == "mlx5_1:1");
  CHECK(plan->ucx.transports != "rc_verbs");  // never a bare rc_verbs (no wireup transport)
}

TEST_CASE("plan_preflight: a node without RDMA devices checks the host path over UCX") {
  const auto empty = std::filesystem::temp_directory_path() / "topolaunch-empty-sysfs";
  std::filesystem::create_directories(empty);
  PreflightPlanInput in = input_for("ndr-ib", {});
  in.sysfs_root = empty.string();
  auto plan = plan_preflight(in);
  REQUIRE(plan.ok());
  CHECK(plan->transport == "ucx");
  CHECK_FALSE(plan->selected.has_value());
  CHECK(plan->devices.empty());
}

TEST_CASE("plan_preflight: an unknown transport is exit 2 naming the setting") {
  PreflightPlanInput in = input_for("ndr-ib", {});
  in.transport = "rdmacm";
  auto plan = plan_preflight(in);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().exit_code == 2);
  CHECK(plan.error().message.find("--transport") != std::string::npos);
}
