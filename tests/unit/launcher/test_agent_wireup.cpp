// The agents' wireup backend: srun's --mpi= for [wireup].backend and what an agent connects to.
#include "catch.hpp"
#include "topolaunch/launcher/agent_wireup.hpp"

using namespace topolaunch::launcher;
using topolaunch::wireup::Backend;

namespace {
// Plain find (Catch2 2.13 and 3.x spell their string matchers differently).
bool has(const std::string& text, const char* needle) {
  return text.find(needle) != std::string::npos;
}
const std::vector<std::string> kAll{"tcp", "pmix", "pmi2"};
const std::vector<std::string> kTcpOnly{"tcp"};
// What Debian's Slurm 22.05 prints for `srun --mpi=list`.
const char* kDebianList =
    "MPI plugin types are...\n\tcray_shasta\n\tnone\n\tpmi2\n\tpmix\n"
    "specific pmix plugin versions available: pmix_v4\n";
}  // namespace

TEST_CASE("srun --mpi=list is parsed into plugin names") {
  CHECK(parse_srun_mpi_list(kDebianList) ==
        std::vector<std::string>{"cray_shasta", "none", "pmi2", "pmix"});
  CHECK(parse_srun_mpi_list("srun: error: Could not establish a configuration source\n").empty());
}

TEST_CASE("srun --mpi= follows wireup.backend") {
  const auto offered = parse_srun_mpi_list(kDebianList);
  CHECK(*srun_mpi_for(WireupBackend::automatic, offered, kAll) == "pmix");
  CHECK(*srun_mpi_for(WireupBackend::automatic, {"none", "pmi2"}, kAll) == "pmi2");
  CHECK(*srun_mpi_for(WireupBackend::automatic, offered, kTcpOnly) == "none");
  CHECK(*srun_mpi_for(WireupBackend::automatic, {}, kAll) == "none");
  CHECK(*srun_mpi_for(WireupBackend::tcp, offered, kAll) == "none");
  CHECK(*srun_mpi_for(WireupBackend::pmi2, offered, kAll) == "pmi2");
  CHECK(*srun_mpi_for(WireupBackend::pmix, offered, kAll) == "pmix");

  auto not_offered = srun_mpi_for(WireupBackend::pmix, {"none", "pmi2"}, kAll);
  REQUIRE(!not_offered);
  CHECK(not_offered.error().exit_code == 2);
  CHECK(has(not_offered.error().message, "wireup.backend"));
  CHECK(has(not_offered.error().message, "no pmix plugin"));
  CHECK(has(not_offered.error().message, "none, pmi2"));
  auto not_built = srun_mpi_for(WireupBackend::pmi2, offered, kTcpOnly);
  REQUIRE(!not_built);
  CHECK(not_built.error().exit_code == 2);
  CHECK(has(not_built.error().message, "wireup.backend"));
  CHECK(has(not_built.error().message, "without PMI2"));
}

TEST_CASE("an agent takes the backend its srun gave it") {
  const topolaunch::wireup::Env pmix{{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "slurm.pmix.7.0"}};
  const topolaunch::wireup::Env pmi2{{"PMI_FD", "5"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "4"}};
  const topolaunch::wireup::Env tcp{{"TOPOLAUNCH_AGENT_STORE", "10.0.0.1:4000"}};
  CHECK(*agent_backend(WireupBackend::automatic, pmix, kAll) == Backend::pmix);
  CHECK(*agent_backend(WireupBackend::automatic, pmi2, kAll) == Backend::pmi2);
  CHECK(*agent_backend(WireupBackend::automatic, tcp, kAll) == Backend::tcp);
  CHECK(*agent_backend(WireupBackend::pmi2, pmi2, kAll) == Backend::pmi2);
  CHECK(*agent_backend(WireupBackend::tcp, tcp, kAll) == Backend::tcp);
  // auto without PMIx compiled in: PMI2 is not there either, so the TCP store must be.
  CHECK(!agent_backend(WireupBackend::automatic, pmix, kTcpOnly));

  auto missing = agent_backend(WireupBackend::pmix, pmi2, kAll);
  REQUIRE(!missing);
  CHECK(missing.error().exit_code == 2);
  CHECK(has(missing.error().message, "wireup.backend = \"pmix\""));
  CHECK(has(missing.error().message, "PMIX_RANK"));
  auto missing2 = agent_backend(WireupBackend::pmi2, tcp, kAll);
  REQUIRE(!missing2);
  CHECK(has(missing2.error().message, "wireup.backend = \"pmi2\""));
  CHECK(has(missing2.error().message, "PMI_FD"));
}

TEST_CASE("the agent's PMI variables are not the workers'") {
  CHECK(is_agent_pmi_variable("PMI_FD"));
  CHECK(is_agent_pmi_variable("PMIX_NAMESPACE"));
  CHECK(is_agent_pmi_variable("PMIX_SERVER_URI41"));
  CHECK_FALSE(is_agent_pmi_variable("PMIX_MCA_gds"));
  CHECK_FALSE(is_agent_pmi_variable("SLURM_PROCID"));
  CHECK_FALSE(is_agent_pmi_variable("TOPOLAUNCH_STORE_ADDR"));
}
