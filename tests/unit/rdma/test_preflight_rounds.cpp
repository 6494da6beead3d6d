// The preflight's schedule of ring edges: edges that share a NIC never run in the same round,
// every edge runs exactly once, and disjoint edges are packed together.
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"
#include "topolaunch/rdma/preflight.hpp"

using namespace topolaunch::rdma;

namespace {

// Checks the invariants and returns the number of rounds.
std::size_t check_schedule(const std::vector<std::string>& nics) {
  const auto rounds = ring_rounds(nics);
  const int n = static_cast<int>(nics.size());
  std::multiset<int> edges;
  for (const auto& round : rounds) {
    REQUIRE_FALSE(round.empty());
    std::multiset<std::string> used;
    for (int p : round) {
      edges.insert(p);
      // The NICs of this edge (one when both ends share it).
      const std::set<std::string> ends{nics[static_cast<std::size_t>(p)],
                                       nics[static_cast<std::size_t>((p + 1) % n)]};
      used.insert(ends.begin(), ends.end());
    }
    for (const auto& nic : used) CHECK(used.count(nic) == 1);  // no NIC in two edges of a round
  }
  CHECK(edges.size() == nics.size());
  for (int p = 0; p < n; ++p) CHECK(edges.count(p) == 1);
  return rounds.size();
}

}  // namespace

TEST_CASE("ring rounds: distinct NICs need 2 rounds for an even ring, 3 for an odd one") {
  CHECK(check_schedule({"a", "b"}) == 2);  // 0->1 and 1->0 share both NICs
  CHECK(check_schedule({"a", "b", "c", "d"}) == 2);
  CHECK(ring_rounds({"a", "b", "c", "d"}) == std::vector<std::vector<int>>{{0, 2}, {1, 3}});
  CHECK(check_schedule({"a", "b", "c"}) == 3);
  CHECK(check_schedule({"a", "b", "c", "d", "e"}) == 3);
  std::vector<std::string> many;
  for (int i = 0; i < 64; ++i) many.push_back("node" + std::to_string(i) + "\nmlx5_0:1");
  CHECK(check_schedule(many) == 2);
}

TEST_CASE("ring rounds: ranks sharing one NIC (one host, loopback) run one edge at a time") {
  CHECK(check_schedule({"localhost\nucx tcp", "localhost\nucx tcp", "localhost\nucx tcp"}) == 3);
  CHECK(ring_rounds({"x", "x", "x"}) == std::vector<std::vector<int>>{{0}, {1}, {2}});
}

TEST_CASE("ring rounds: two ranks per NIC on 4 nodes keep NIC-sharing edges apart") {
  // Ranks 2k and 2k+1 share node k's NIC: edges inside a node use that NIC twice.
  std::vector<std::string> nics;
  for (int node = 0; node < 4; ++node)
    for (int local = 0; local < 2; ++local)
      nics.push_back("n" + std::to_string(node) + "\nmlx5_0:1");
  const std::size_t rounds = check_schedule(nics);
  CHECK(rounds >= 2);
  CHECK(rounds < nics.size());  // still better than one edge at a time
}

TEST_CASE("ring rounds: a single rank is one loopback edge, an empty world nothing") {
  CHECK(ring_rounds({"a"}) == std::vector<std::vector<int>>{{0}});
  CHECK(ring_rounds({}).empty());
}
