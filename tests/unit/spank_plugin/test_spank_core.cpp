#include <string>
#include <string_view>
#include <vector>

#include "catch.hpp"
#include "site_config.hpp"
#include "slurm_text.hpp"
#include "task_binding.hpp"
#include "text_checks.hpp"

using namespace topolaunch::spank;
using topolaunch::topology::CpuSet;

TEST_CASE("plugstack args: key=value parsed into the site config") {
  auto site = parse_site_config({"mode=verbose", "topology_xml=/etc/tl/%n.xml", "nics=^mlx5_1",
                                 "enforce_binding=0", "log_level=debug"});
  REQUIRE(site.ok());
  CHECK(site->default_mode == Mode::verbose);
  CHECK(site->topology_xml == "/etc/tl/%n.xml");
  CHECK(site->nics_text == "^mlx5_1");
  CHECK_FALSE(site->enforce_binding);
  CHECK(site->log_level == LogLevel::debug);
  CHECK(expand_node_pattern(site->topology_xml, "n3") == "/etc/tl/n3.xml");
}

TEST_CASE("plugstack args: unknown, repeated, bare and malformed keys are errors") {
  CHECK_FALSE(parse_site_config({"modes=auto"}).ok());
  CHECK_FALSE(parse_site_config({"mode=auto", "mode=off"}).ok());
  CHECK_FALSE(parse_site_config({"verbose"}).ok());
  CHECK_FALSE(parse_site_config({"topology_xml=relative/%n.xml"}).ok());
  CHECK_FALSE(parse_site_config({"topology_xml=/x/%h.xml"}).ok());
  CHECK_FALSE(parse_site_config({"enforce_binding=maybe"}).ok());
  auto unknown = parse_site_config({"colour=red"});
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("unknown key 'colour'") != std::string::npos);
}

TEST_CASE("user values: modes, policies, paths and NIC lists are validated") {
  CHECK(parse_mode("auto").ok());
  CHECK_FALSE(parse_mode("bogus").ok());
  CHECK_FALSE(parse_mode(std::string(5000, 'x')).ok());
  CHECK(parse_mode(std::string(5000, 'x')).error().message.size() < 120);
  CHECK(parse_policy("cyclic").ok());
  CHECK_FALSE(parse_policy("random").ok());
  CHECK(check_path("/home/u/job.toml", "--topolaunch-config").ok());
  CHECK_FALSE(check_path("", "--topolaunch-config").ok());
  CHECK_FALSE(check_path(std::string(2000, 'a'), "--topolaunch-config").ok());
  CHECK_FALSE(check_path("/tmp/a b.toml", "--topolaunch-config").ok());
  CHECK_FALSE(check_path("/tmp/$(id).toml", "--topolaunch-config").ok());
  CHECK_FALSE(check_path(std::string("/tmp/a\nb"), "--topolaunch-config").ok());
  CHECK(parse_nic_list("^mlx5_1,mlx5_2", "--topolaunch-nics").ok());
  CHECK_FALSE(parse_nic_list("mlx5_0;rm", "--topolaunch-nics").ok());
}

TEST_CASE("hostlists and task counts expand like Slurm's") {
  auto hosts = expand_hostlist("n[1-3,7],gpu-a[08-10],login");
  REQUIRE(hosts.ok());
  CHECK(*hosts ==
        std::vector<std::string>{"n1", "n2", "n3", "n7", "gpu-a08", "gpu-a09", "gpu-a10", "login"});
  auto two = expand_hostlist("rack[1-2]-n[1-2]");
  REQUIRE(two.ok());
  CHECK(*two == std::vector<std::string>{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK_FALSE(expand_hostlist("n[3-1]").ok());
  CHECK_FALSE(expand_hostlist("n[1-2").ok());
  CHECK_FALSE(expand_hostlist("n[1-999999]").ok());
  auto counts = expand_tasks_per_node("8(x2),4");
  REQUIRE(counts.ok());
  CHECK(*counts == std::vector<int>{8, 8, 4});
  CHECK_FALSE(expand_tasks_per_node("8(x2").ok());
}

TEST_CASE("binding: intended CPUs on a real node, a fold onto existing CPUs on an emulated one") {
  const CpuSet host = *CpuSet::parse_list("0-1");
  auto real = choose_binding(*CpuSet::parse_list("1"), host, 5);
  CHECK(real.cpus.to_list() == "1");
  CHECK_FALSE(real.emulated);
  auto partial = choose_binding(*CpuSet::parse_list("0,112"), host, 3);
  CHECK(partial.cpus.to_list() == "0");
  CHECK(partial.emulated);
  auto absent = choose_binding(*CpuSet::parse_list("56-69"), host, 3);
  CHECK(absent.cpus.to_list() == "1");  // local task 3 -> allowed[3 % 2]
  CHECK(absent.emulated);
}
