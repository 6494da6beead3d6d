#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "catch.hpp"
#include "node_plan.hpp"
#include "site_config.hpp"
#include "slurm_text.hpp"
#include "task_binding.hpp"
#include "text_checks.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/serialize.hpp"
#include "topology_cache.hpp"

using namespace topolaunch::spank;
using topolaunch::Result;
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

TEST_CASE("refusals echo a value as printable text only") {
  // Found by tests/fuzz/fuzz_spank_options: a control byte in a plugstack argument went into the
  // message, and so into slurmstepd's log, as it was.
  auto bare = parse_site_config({"\x1b[2J"});
  REQUIRE_FALSE(bare.ok());
  CHECK(bare.error().message == "plugstack.conf: '?[2J': expected key=value");
  auto level = parse_site_config({"log_level=a\nb"});
  REQUIRE_FALSE(level.ok());
  CHECK(level.error().message == "plugstack.conf: log_level=a?b: use error, info or debug");
  auto hosts = expand_hostlist("n[1-2\n");
  REQUIRE_FALSE(hosts.ok());
  CHECK(hosts.error().message == "'n[1-2?': unbalanced brackets");
  CHECK(shown(std::string(50, 'x')) == std::string(40, 'x') + "...");
}

// The snippet meson installs into plugstack.conf.d (spank_plugin/topolaunch.conf.in, configured).
TEST_CASE("plugstack.conf.d snippet: the example line parses and every site option is documented") {
  const char* path = std::getenv("TOPOLAUNCH_PLUGSTACK_SNIPPET");
  REQUIRE(path != nullptr);
  std::ifstream file(path);
  REQUIRE(file.good());
  std::vector<std::string> example;
  std::map<std::string, std::string> documented;  // key -> its values as the comment spells them
  const std::regex option_line(R"(^#   ([a-z_]+)=(\S+).*)");
  for (std::string line; std::getline(file, line);) {
    std::smatch m;
    if (std::regex_match(line, m, option_line)) documented[m[1]] = m[2];
    if (line.rfind("#required ", 0) == 0 || line.rfind("#optional ", 0) == 0) {
      std::istringstream words(line.substr(1));
      example.assign(std::istream_iterator<std::string>(words), {});
    }
  }
  REQUIRE(example.size() >= 2);
  CHECK(example[1].front() == '/');
  CHECK(example[1].ends_with("/spank_topolaunch.so"));
  const std::vector<std::string> args(example.begin() + 2, example.end());
  auto site = parse_site_config({args.begin(), args.end()});
  CHECK(site.ok());

  // The keys the parser knows are the ones its error for an unknown key lists.
  auto unknown = parse_site_config({"no_such_key=1"});
  REQUIRE_FALSE(unknown.ok());
  const std::string& message = unknown.error().message;
  const auto known_at = message.find("(known: ");
  REQUIRE(known_at != std::string::npos);
  std::set<std::string> known;
  std::istringstream list(message.substr(known_at + 8, message.find(')', known_at) - known_at - 8));
  for (std::string key; std::getline(list >> std::ws, key, ',');) known.insert(key);
  std::set<std::string> documented_keys;
  for (const auto& [key, values] : documented) documented_keys.insert(key);
  CHECK(documented_keys == known);

  // Every value the comment offers for a key with a fixed set of values is accepted.
  for (const auto& [key, values] : documented) {
    if (values.find('|') == std::string::npos) continue;
    std::istringstream alternatives(values);
    for (std::string value; std::getline(alternatives, value, '|');) {
      const std::string arg = key + "=" + value;
      INFO(arg);
      CHECK(parse_site_config({std::string_view(arg)}).ok());
    }
  }
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
  // Caught by tests/fuzz/fuzz_spank_options (its task-count check, UBSan) on inputs written from
  // reading the code: a count above INT_MAX wrapped to a negative int, and the last
  // representable host number stepped the loop past LONG_MAX.
  CHECK_FALSE(expand_tasks_per_node("4294967295").ok());
  CHECK(expand_tasks_per_node("2147483647")->front() == 2147483647);
  auto last = expand_hostlist("n[9223372036854775807]");
  REQUIRE(last.ok());
  CHECK(*last == std::vector<std::string>{"n9223372036854775807"});
  CHECK_FALSE(expand_hostlist("n[0-9223372036854775807]").ok());
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

namespace {

std::shared_ptr<const topolaunch::topology::NodeTopology> fixture(const char* type) {
  const char* dir = std::getenv("TOPOLAUNCH_FIXTURES_DIR");
  REQUIRE(dir != nullptr);
  auto topo =
      topolaunch::topology::load_topology_file(std::string(dir) + "/slurm/" + type + ".pci.xml");
  REQUIRE(topo.ok());
  return std::make_shared<const topolaunch::topology::NodeTopology>(*topo);
}

StepInfo two_node_step(const std::string& me) {
  StepInfo step;
  step.job_id = 42;
  step.step_id = 0;
  step.node_name = me;
  step.step_nodes = {"n1", "n2"};
  step.tasks_per_node = {8, 8};
  step.world_size = 16;
  step.local_tasks = 8;
  return step;
}

}  // namespace

TEST_CASE("node plan: DGX H100 pair, this node's ranks, torchrun names and rendezvous") {
  auto h100 = fixture("dgx-h100");
  TopologyLoader same = [&](const std::string&) {
    return Result<std::shared_ptr<const topolaunch::topology::NodeTopology>>(h100);
  };
  auto plan = plan_node(two_node_step("n2"), h100, same, {});
  REQUIRE(plan.ok());
  REQUIRE(plan->tasks.size() == 8);
  std::set<std::string> gpus;
  for (const auto& task : plan->tasks) {
    CHECK(task.env.at("WORLD_SIZE") == "16");
    CHECK(task.env.at("LOCAL_WORLD_SIZE") == "8");
    CHECK(task.env.at("MASTER_ADDR") == "n1");
    CHECK(task.env.at("MASTER_PORT") == std::to_string(master_port_for(42, 0)));
    CHECK(std::stoi(task.env.at("RANK")) >= 8);
    CHECK(task.env.at("TOPOLAUNCH_CPUS") == task.rank.cpus.to_list());
    gpus.insert(task.env.at("CUDA_VISIBLE_DEVICES"));
  }
  CHECK(gpus.size() == 8);
}

TEST_CASE("node plan: uneven tasks per node and cores beyond the topology are refused") {
  auto h100 = fixture("dgx-h100");
  TopologyLoader same = [&](const std::string&) {
    return Result<std::shared_ptr<const topolaunch::topology::NodeTopology>>(h100);
  };
  auto uneven = two_node_step("n1");
  uneven.tasks_per_node = {8, 4};
  uneven.world_size = 12;
  auto refused = plan_node(uneven, h100, same, {});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("same number of tasks") != std::string::npos);

  auto wide = two_node_step("n1");
  wide.alloc_cores = *CpuSet::parse_list("0-200");
  auto too_wide = plan_node(wide, h100, same, {});
  REQUIRE_FALSE(too_wide.ok());
  CHECK(too_wide.error().message.find("has 112 cores") != std::string::npos);

  auto user_port = two_node_step("n1");
  user_port.env["MASTER_PORT"] = "12345";
  auto kept = plan_node(user_port, h100, same, {});
  REQUIRE(kept.ok());
  CHECK(kept->tasks.front().env.at("MASTER_PORT") == "12345");
}

namespace {

// A private directory with three node files: n1 and n3 alike (DGX H100), n2 an L40S box.
struct CacheFixture {
  std::filesystem::path dir;
  SiteConfig site;
  CacheFixture() {
    char name[] = "/tmp/topolaunch-cache-test-XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    dir = name;
    const char* fixtures = std::getenv("TOPOLAUNCH_FIXTURES_DIR");
    REQUIRE(fixtures != nullptr);
    std::filesystem::create_directory(dir / "topo");
    for (const auto& [node, type] : std::map<std::string, std::string>{
             {"n1", "dgx-h100"}, {"n2", "pcie-l40s-8gpu"}, {"n3", "dgx-h100"}}) {
      std::filesystem::copy_file(std::string(fixtures) + "/slurm/" + type + ".pci.xml",
                                 dir / "topo" / (node + ".xml"));
    }
    site.topology_xml = (dir / "topo" / "%n.xml").string();
    site.topology_cache = (dir / "cache").string();
  }
  ~CacheFixture() { std::filesystem::remove_all(dir); }
  std::string direct_json(const std::string& node) const {
    topolaunch::topology::DiscoverOptions options;
    options.hostname = node;
    auto topo = topolaunch::topology::load_topology_file(
        expand_node_pattern(site.topology_xml, node), options);
    REQUIRE(topo.ok());
    return topolaunch::topology::to_json(*topo);
  }
};

const std::vector<std::string> kThreeNodes{"n1", "n2", "n3"};

}  // namespace

TEST_CASE("topology cache: the first step imports each distinct file, later steps none") {
  CacheFixture f;
  auto first = load_step_topologies(f.site, kThreeNodes, "n3");
  REQUIRE(first.ok());
  REQUIRE(first->unusable.empty());
  CHECK(first->imported == 2);  // n1 and n3 have the same bytes
  CHECK(first->from_cache == 0);
  CHECK(first->distinct == 2);
  CHECK(first->write_error.empty());
  // This node's own topology is what a direct load gives, its name and file included.
  CHECK(topolaunch::topology::to_json(*first->by_node.at("n3")) == f.direct_json("n3"));
  CHECK(first->by_node.at("n2")->gpus.size() == 8);
  CHECK(first->by_node.at("n2")->cores.size() != first->by_node.at("n1")->cores.size());
  CHECK(std::filesystem::is_directory(f.dir / "cache" / "topologies"));
  CHECK((std::filesystem::status(f.dir / "cache").permissions() &
         (std::filesystem::perms::group_all | std::filesystem::perms::others_all)) ==
        std::filesystem::perms::none);

  auto second = load_step_topologies(f.site, kThreeNodes, "n2");
  REQUIRE(second.ok());
  REQUIRE(second->unusable.empty());
  CHECK(second->imported == 0);
  CHECK(second->from_cache == 3);
  CHECK(topolaunch::topology::to_json(*second->by_node.at("n2")) == f.direct_json("n2"));
  CHECK(second->by_node.at("n1") == second->by_node.at("n3"));  // one parse for alike nodes
}

TEST_CASE("topology cache off: every file read, alike bytes imported once, the same topologies") {
  CacheFixture f;
  auto direct = load_step_topologies_direct(f.site, kThreeNodes, "n3");
  REQUIRE(direct.ok());
  CHECK(direct->imported == 2);
  CHECK(direct->distinct == 2);
  CHECK(direct->from_cache == 0);
  CHECK(direct->by_node.at("n1") == direct->by_node.at("n3"));
  CHECK(topolaunch::topology::to_json(*direct->by_node.at("n3")) == f.direct_json("n3"));
  CHECK(topolaunch::topology::to_json(*direct->by_node.at("n2")) == f.direct_json("n2"));
  CHECK_FALSE(std::filesystem::exists(f.site.topology_cache));
  auto missing = load_step_topologies_direct(f.site, {"n1", "n9"}, "n1");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("n9.xml") != std::string::npos);
}

TEST_CASE("topology cache: a changed file or a damaged entry is imported again") {
  CacheFixture f;
  REQUIRE(load_step_topologies(f.site, kThreeNodes, "n1").ok());
  SECTION("a node's file replaced by another type") {
    std::filesystem::copy_file(f.dir / "topo" / "n2.xml", f.dir / "topo" / "n1.xml",
                               std::filesystem::copy_options::overwrite_existing);
    auto after = load_step_topologies(f.site, kThreeNodes, "n1");
    REQUIRE(after.ok());
    REQUIRE(after->unusable.empty());
    CHECK(after->imported == 0);  // its new bytes are n2's, already imported
    CHECK(after->from_cache == 2);
    CHECK(topolaunch::topology::to_json(*after->by_node.at("n1")) == f.direct_json("n1"));
    CHECK(after->by_node.at("n1")->gpus.size() == after->by_node.at("n2")->gpus.size());
  }
  SECTION("a cut topology entry") {
    for (const auto& entry : std::filesystem::directory_iterator(f.dir / "cache" / "topologies")) {
      std::filesystem::resize_file(entry.path(), 100);
    }
    auto after = load_step_topologies(f.site, kThreeNodes, "n1");
    REQUIRE(after.ok());
    REQUIRE(after->unusable.empty());
    CHECK(after->imported == 2);
    CHECK(topolaunch::topology::to_json(*after->by_node.at("n1")) == f.direct_json("n1"));
  }
  SECTION("a FIFO in place of an entry") {
    for (const auto& entry : std::filesystem::directory_iterator(f.dir / "cache" / "files")) {
      std::filesystem::remove(entry.path());
      REQUIRE(::mkfifo(entry.path().c_str(), 0600) == 0);
    }
    auto after = load_step_topologies(f.site, kThreeNodes, "n1");  // must not block
    REQUIRE(after.ok());
    REQUIRE(after->unusable.empty());
    CHECK(after->from_cache == 0);
    CHECK(topolaunch::topology::to_json(*after->by_node.at("n1")) == f.direct_json("n1"));
  }
  SECTION("an index entry that names another path") {
    for (const auto& entry : std::filesystem::directory_iterator(f.dir / "cache" / "files")) {
      std::ofstream(entry.path()) << "topolaunch-topology-cache 1\n/elsewhere.xml\n1 2 3\n"
                                  << std::string(32, '0') << "\n";
    }
    auto after = load_step_topologies(f.site, kThreeNodes, "n2");
    REQUIRE(after.ok());
    CHECK(after->from_cache == 0);
    CHECK(topolaunch::topology::to_json(*after->by_node.at("n2")) == f.direct_json("n2"));
  }
}

TEST_CASE("topology cache: a NIC filter changed in plugstack.conf never reads the old import") {
  CacheFixture f;
  REQUIRE(load_step_topologies(f.site, kThreeNodes, "n1").ok());
  // The index entries of unchanged files once led to the import made under the old filter.
  f.site.nics_text = "^mlx5_0";
  f.site.nics.exclude = {"mlx5_0"};
  auto after = load_step_topologies(f.site, kThreeNodes, "n1");
  REQUIRE(after.ok());
  REQUIRE(after->unusable.empty());
  CHECK(after->imported == 2);
  CHECK(after->from_cache == 0);
  topolaunch::topology::DiscoverOptions options;
  options.hostname = "n1";
  options.nics = f.site.nics;
  auto direct = topolaunch::topology::load_topology_file(
      expand_node_pattern(f.site.topology_xml, "n1"), options);
  REQUIRE(direct.ok());
  CHECK(topolaunch::topology::to_json(*after->by_node.at("n1")) ==
        topolaunch::topology::to_json(*direct));
}

TEST_CASE("topology cache: an unsafe directory is not used, a missing node file is an error") {
  CacheFixture f;
  SECTION("writable by others") {
    std::filesystem::create_directory(f.site.topology_cache);
    ::chmod(f.site.topology_cache.c_str(), 0777);
    auto loaded = load_step_topologies(f.site, kThreeNodes, "n1");
    REQUIRE(loaded.ok());
    CHECK(loaded->unusable.find("writable by group or others") != std::string::npos);
    CHECK(loaded->by_node.empty());
  }
  SECTION("a symbolic link") {
    std::filesystem::create_directory(f.dir / "real");
    ::chmod((f.dir / "real").c_str(), 0700);
    std::filesystem::create_directory_symlink(f.dir / "real", f.site.topology_cache);
    auto loaded = load_step_topologies(f.site, kThreeNodes, "n1");
    REQUIRE(loaded.ok());
    CHECK(loaded->unusable.find("is not a directory") != std::string::npos);
  }
  SECTION("a parent that does not exist") {
    f.site.topology_cache = (f.dir / "no" / "such").string();
    auto loaded = load_step_topologies(f.site, kThreeNodes, "n1");
    REQUIRE(loaded.ok());
    CHECK(loaded->unusable.find("cannot create") != std::string::npos);
  }
  SECTION("a node without its file") {
    auto loaded = load_step_topologies(f.site, {"n1", "n9"}, "n1");
    REQUIRE_FALSE(loaded.ok());
    CHECK(loaded.error().message.find("n9.xml") != std::string::npos);
    CHECK(loaded.error().exit_code == 2);
  }
}

TEST_CASE("plugstack args: topology_cache is a path or off") {
  auto site = parse_site_config({"topology_cache=/var/tmp/tl"});
  REQUIRE(site.ok());
  CHECK(site->topology_cache == "/var/tmp/tl");
  CHECK(parse_site_config({})->topology_cache == "/var/cache/topolaunch");
  CHECK(parse_site_config({"topology_cache=off"})->topology_cache.empty());
  auto relative = parse_site_config({"topology_cache=cache"});
  REQUIRE_FALSE(relative.ok());
  CHECK(relative.error().message.find("topology_cache") != std::string::npos);
}
