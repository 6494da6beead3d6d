// Plain data: CpuSet, PciAddress, NicFilter, Relation.
#include <vector>

#include "catch.hpp"
#include "topolaunch/topology/cpuset.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/model.hpp"
#include "topolaunch/topology/relation.hpp"

using namespace topolaunch::topology;

TEST_CASE("CpuSet parses and prints cpulists like nvidia-smi", "[cpuset]") {
  auto set = CpuSet::parse_list("48-63,176-191");
  REQUIRE(set);
  CHECK(set->size() == 32);
  CHECK(set->to_list() == "48-63,176-191");
  CHECK(CpuSet::parse_list("3,1,2,2,8")->to_list() == "1-3,8");
  CHECK(CpuSet::parse_list("")->empty());
  CHECK(CpuSet::parse_list(" 0 - 3 ")->to_list() == "0-3");
  CHECK_FALSE(CpuSet::parse_list("3-1"));
  CHECK_FALSE(CpuSet::parse_list("a"));
  CHECK_FALSE(CpuSet::parse_list("1,,2"));
  CHECK_FALSE(CpuSet::parse_list("-1"));
  CHECK_FALSE(CpuSet::parse_list("0-2000000000"));
  CHECK(CpuSet({5, -1, 3, 5}).ids() == std::vector<int>{3, 5});
}

TEST_CASE("CpuSet parses Linux and hwloc hex masks", "[cpuset]") {
  CHECK(CpuSet::parse_mask("0x0000ffff,0xffffffff")->to_list() == "0-47");
  CHECK(CpuSet::parse_mask("00000000,0000ffff")->to_list() == "0-15");
  CHECK(CpuSet::parse_mask("0x00000001,,0x00000003")->to_list() == "0-1,64");
  CHECK(CpuSet::parse_mask("ff00")->to_list() == "8-15");
  CHECK(CpuSet::parse_mask("0x0")->empty());
  CHECK_FALSE(CpuSet::parse_mask(""));
  CHECK_FALSE(CpuSet::parse_mask("0xzz"));
  CHECK_FALSE(CpuSet::parse_mask("0x1ffffffff"));  // more than 32 bits in one word
}

TEST_CASE("CpuSet set operations", "[cpuset]") {
  const CpuSet a({0, 1, 2, 3}), b({2, 3, 4});
  CHECK((a & b).to_list() == "2-3");
  CHECK((a | b).to_list() == "0-4");
  CHECK((a - b).to_list() == "0-1");
  CHECK(a.intersects(b));
  CHECK_FALSE(a.intersects(CpuSet({7})));
  // The walk skips ahead on either side; interleaved sets that never meet, and ones that meet
  // only at the last id of each, against the intersection's answer.
  const CpuSet evens({0, 2, 4, 6, 8, 100}), odds({1, 3, 5, 7, 9, 101});
  CHECK_FALSE(evens.intersects(odds));
  CHECK_FALSE(odds.intersects(evens));
  CHECK(evens.intersects(CpuSet({1, 3, 5, 100})));
  CHECK(CpuSet({1, 3, 5, 100}).intersects(evens));
  CHECK_FALSE(CpuSet().intersects(a));
  CHECK_FALSE(a.intersects(CpuSet()));
  for (int lo = 0; lo < 6; ++lo) {
    for (int hi = lo; hi < 12; ++hi) {
      std::vector<int> ids;
      for (int i = lo; i <= hi; i += 3) ids.push_back(i);
      const CpuSet c(ids);
      CHECK(c.intersects(b) == !(c & b).empty());
      CHECK(b.intersects(c) == !(b & c).empty());
    }
  }
  CHECK(a.contains_all(CpuSet({1, 2})));
  CHECK_FALSE(a.contains_all(b));
  CHECK(a.contains(3));
  CHECK(a.first() == 0);
  CHECK(CpuSet().first() == -1);
}

TEST_CASE("PciAddress parses the forms hwloc, sysfs and NVML print", "[pci]") {
  auto full = PciAddress::parse("0000:1b:00.0");
  REQUIRE(full);
  CHECK(full->bus == 0x1b);
  CHECK(full->to_string() == "0000:1b:00.0");
  CHECK(PciAddress::parse("1b:00.1")->to_string() == "0000:1b:00.1");
  CHECK(PciAddress::parse("00000000:1B:00.0")->to_string() == "0000:1b:00.0");
  CHECK(PciAddress::parse("0035:03:00.0")->domain == 0x35);
  CHECK(PciAddress::parse("10000:01:00.0")->to_string() == "10000:01:00.0");
  CHECK_FALSE(PciAddress::parse("1b:00"));
  CHECK_FALSE(PciAddress::parse("0000:1b:20.0"));  // device > 0x1f
  CHECK_FALSE(PciAddress::parse("0000:1b:00.8"));
  CHECK_FALSE(PciAddress::parse("0000:1bb:00.0"));
  CHECK_FALSE(PciAddress::parse(""));
  CHECK(*PciAddress::parse("0000:1b:00.0") < *PciAddress::parse("0000:43:00.0"));
  CHECK(*PciAddress::parse("0000:ff:00.0") < *PciAddress::parse("0001:00:00.0"));
}

TEST_CASE("NicFilter follows NCCL_IB_HCA syntax", "[nic]") {
  auto all = NicFilter::parse("");
  REQUIRE(all);
  CHECK(all->selects("mlx5_7"));

  auto prefix = NicFilter::parse("mlx5_0,mlx5_1:1");
  REQUIRE(prefix);
  CHECK(prefix->selects("mlx5_0"));
  CHECK(prefix->selects("mlx5_10"));  // prefix match, as NCCL does
  CHECK_FALSE(prefix->selects("mlx5_2"));

  auto exact = NicFilter::parse("=mlx5_0:1,mlx5_3:1");
  REQUIRE(exact);
  CHECK(exact->exact);
  CHECK(exact->selects("mlx5_3"));
  CHECK_FALSE(exact->selects("mlx5_10"));

  auto storage = NicFilter::parse("^=mlx5_1,mlx5_2");
  REQUIRE(storage);
  CHECK(storage->include.empty());
  CHECK(storage->selects("mlx5_0"));
  CHECK(storage->selects("mlx5_10"));
  CHECK_FALSE(storage->selects("mlx5_1"));

  auto not_mlx = NicFilter::parse("^mlx5");
  REQUIRE(not_mlx);
  CHECK_FALSE(not_mlx->selects("mlx5_0"));
  CHECK(not_mlx->selects("rdmap197s0"));

  CHECK_FALSE(NicFilter::parse("mlx5_0,,mlx5_1"));
  CHECK_FALSE(NicFilter::parse("^"));
  CHECK_FALSE(NicFilter::parse("=:1"));
}

TEST_CASE("NicFilter: the names asked for that select no NIC of a node", "[nic]") {
  const std::vector<std::string> dgx{"mlx5_0", "mlx5_1", "mlx5_10"};
  CHECK(NicFilter::parse("mlx5_0,nosuchnic9")->unmatched(dgx) ==
        std::vector<std::string>{"nosuchnic9"});
  CHECK(NicFilter::parse("mlx5")->unmatched(dgx).empty());  // a prefix that selects some
  CHECK(NicFilter::parse("=mlx5")->unmatched(dgx) == std::vector<std::string>{"mlx5"});
  CHECK(NicFilter::parse("^nosuchnic9")->unmatched(dgx).empty());  // excludes nothing: fine
  CHECK(NicFilter::parse("")->unmatched({}).empty());
  CHECK(NicFilter::parse("mlx5_0")->unmatched({}) == std::vector<std::string>{"mlx5_0"});
}

TEST_CASE("check_named_nics names the option, the node, the NIC and the node's NICs", "[nic]") {
  NodeTopology topo;
  for (const char* name : {"mlx5_0", "mlx5_1"}) {
    Nic nic;
    nic.name = name;
    topo.nics.push_back(nic);
  }
  CHECK(check_named_nics(*NicFilter::parse("mlx5_1"), topo, "n1", "--topolaunch-nics=mlx5_1"));
  auto missing =
      check_named_nics(*NicFilter::parse("nosuchnic9"), topo, "n1", "--topolaunch-nics=nosuchnic9");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message ==
        "--topolaunch-nics=nosuchnic9: node n1 has no NIC nosuchnic9 (its NICs: mlx5_0, mlx5_1)");
  CHECK(missing.error().exit_code == 2);
  auto none = check_named_nics(*NicFilter::parse("mlx5_0"), NodeTopology{}, "vm", "rdma.nics");
  REQUIRE_FALSE(none);
  CHECK(none.error().message == "rdma.nics: node vm has no NIC mlx5_0 (it has no RDMA NICs)");
}

TEST_CASE("Relation prints, parses and ranks like nvidia-smi", "[relation]") {
  for (const char* text : {"X", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"}) {
    auto r = Relation::parse(text);
    REQUIRE(r);
    CHECK(r->to_string() == text);
  }
  CHECK_FALSE(Relation::parse("NV"));
  CHECK_FALSE(Relation::parse("NV0"));
  CHECK_FALSE(Relation::parse("nv4"));
  CHECK(Relation::parse("NV4")->closer_than(*Relation::parse("PIX")));
  CHECK(Relation::parse("NV18")->closer_than(*Relation::parse("NV12")));
  CHECK(Relation::parse("PIX")->closer_than(*Relation::parse("PXB")));
  CHECK(Relation::parse("PHB")->closer_than(*Relation::parse("NODE")));
  CHECK(Relation::parse("NODE")->closer_than(*Relation::parse("SYS")));
  CHECK_FALSE(Relation::parse("SYS")->closer_than(*Relation::parse("SYS")));
}
