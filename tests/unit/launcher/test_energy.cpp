// RAPL's package counters from a powercap tree (a fake one in a temporary folder), their
// wraparound.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "catch.hpp"
#include "topolaunch/launcher/energy.hpp"

using namespace topolaunch::launcher;
namespace fs = std::filesystem;

namespace {

struct PowercapTree {
  fs::path root;
  PowercapTree() {
    char tmpl[] = "/tmp/topolaunch-rapl-XXXXXX";
    root = ::mkdtemp(tmpl);
  }
  ~PowercapTree() { fs::remove_all(root); }
  void domain(const std::string& name, std::uint64_t uj, std::uint64_t range) const {
    fs::create_directories(root / name);
    std::ofstream(root / name / "energy_uj") << uj << "\n";
    std::ofstream(root / name / "max_energy_range_uj") << range << "\n";
  }
};

}  // namespace

TEST_CASE("RAPL: package domains only, their advance in joules, a wrapped counter") {
  PowercapTree t;
  t.domain("intel-rapl:0", 1'000'000, 262'143'328'850);
  t.domain("intel-rapl:1", 262'143'000'000, 262'143'328'850);
  t.domain("intel-rapl:0:0", 5, 262'143'328'850);  // the package's core: counted in it already
  RaplEnergy e = RaplEnergy::open(t.root.string());
  REQUIRE(e.readable());
  CHECK(e.domains() == 2);
  t.domain("intel-rapl:0", 3'500'000, 262'143'328'850);  // +2.5 J
  t.domain("intel-rapl:1", 671'000, 262'143'328'850);    // wrapped: +328850 + 671000 uJ
  e.sample();
  CHECK(e.joules() == Approx(2.5 + 0.99985));
  e.sample();  // nothing advanced
  CHECK(e.joules() == Approx(2.5 + 0.99985));
}

TEST_CASE("RAPL: missing or unreadable, it says why and measures nothing") {
  CHECK(RaplEnergy::open("/nonexistent/powercap").why_not() ==
        "no RAPL here (/nonexistent/powercap is missing)");
  PowercapTree t;
  fs::create_directories(t.root / "intel-rapl:0");  // no energy_uj to read
  RaplEnergy e = RaplEnergy::open(t.root.string());
  CHECK_FALSE(e.readable());
  CHECK(e.why_not() == "RAPL's energy_uj is not readable (root only since Linux 5.10)");
  PowercapTree empty;
  CHECK(RaplEnergy::open(empty.root.string()).why_not().rfind("no RAPL package domain in", 0) == 0);
}
