// How the agents of a multi-node job exchange their NodeTopology: the KvStore named by
// [wireup].backend. `run` starts the agents with `srun --mpi=<pmix|pmi2|none>` to match, and each
// agent connects to what that srun gave it. Workers always get the TCP store (they exchange NCCL
// ids and UCX blobs through it, whatever the agents used).
//
//   auto  PMIx when srun offers the pmix plugin and this build has PMIx, else PMI2 likewise, else
//         the TCP store that `run` hosts. An agent on "auto" takes PMIx when PMIX_RANK and
//         PMIX_NAMESPACE are set, else PMI2 when PMI_FD or PMI_RANK is set, else TCP.
//   pmix / pmi2 / tcp  exactly that; a backend that is not there (not compiled in, not offered
//         by srun, not in the agent's environment) is an error naming wireup.backend (exit 2).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/launcher/job_config.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::launcher {

// The plugin names in the output of `srun --mpi=list` ("MPI plugin types are...\n\tnone\n\tpmi2
// ..."), without the header and the "specific pmix plugin versions" line.
std::vector<std::string> parse_srun_mpi_list(std::string_view text);

// The value of srun's --mpi= for the agents' step: "pmix", "pmi2" or "none".
Result<std::string> srun_mpi_for(WireupBackend requested, const std::vector<std::string>& offered,
                                 const std::vector<std::string>& compiled);

// The backend an agent uses, from what was requested and its environment.
Result<wireup::Backend> agent_backend(WireupBackend requested, const wireup::Env& env,
                                      const std::vector<std::string>& compiled);

std::string_view backend_name(wireup::Backend backend);  // "tcp", "pmix", "pmi2"

// Variables that describe the agent's own PMI step, not a worker's: left out of the workers'
// environment (PMIX_* but the user's PMIX_MCA_* settings, PMI_*), so a worker never talks to the
// agent's PMI server by mistake.
bool is_agent_pmi_variable(std::string_view name);

}  // namespace topolaunch::launcher
