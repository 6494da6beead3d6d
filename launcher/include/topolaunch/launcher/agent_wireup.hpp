// How the agents of a multi-node job exchange their NodeTopology: the KvStore named by
// [wireup].backend. `run` starts the agents with `srun --mpi=<pmix|pmi2|none>` to match, and each
// agent connects to what that srun gave it. Workers always get the TCP store (they exchange NCCL
// ids and UCX blobs through it, whatever the agents used), through their agent's relay.
//
// Traffic that does not grow as N^2 (docs/wireup-cost-model.md has the figures):
//   - The agents exchange small records (name, allocation, topology fingerprint, relay address;
//     ~70 bytes) with one allgather; each distinct topology (~22 KB for a DGX H100) travels once,
//     put by the first agent that has it and read by those that do not.
//   - Every agent hosts a relay of the workers' TCP store; the relays form a tree of fan-out 16
//     over the agents (agent i's upstream is agent (i-1)/16's relay, agent 0's the root store that
//     `run` hosts), so the root serves 16 relays instead of every rank, and a value reaches a
//     node once, however many of its ranks read it. With the TCP backend the agents' own store
//     is a tree the same way: each agent first tells the root its relay's address and reads its
//     parent's (O(N) small requests), then exchanges through its own relay.
//
//   auto  PMIx when srun offers the pmix plugin and this build has PMIx, else PMI2 likewise, else
//         the TCP store that `run` hosts. An agent on "auto" takes PMIx when PMIX_RANK and
//         PMIX_NAMESPACE are set, else PMI2 when PMI_FD or PMI_RANK is set, else TCP.
//   pmix / pmi2 / tcp  exactly that; a backend that is not there (not compiled in, not offered
//         by srun, not in the agent's environment) is an error naming wireup.backend (exit 2).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/wireup/kv_store.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

namespace topolaunch::launcher {

// The plugin names in the output of `srun --mpi=list` ("MPI plugin types are...\n\tnone\n\tpmi2
// ..."), without the header and the "specific pmix plugin versions" line.
std::vector<std::string> parse_srun_mpi_list(std::string_view text);

// The value of srun's --mpi= for the agents' step: "pmix", "pmi2" or "none".
Result<std::string> srun_mpi_for(jobspec::WireupBackend requested,
                                 const std::vector<std::string>& offered,
                                 const std::vector<std::string>& compiled);

// The backend an agent uses, from what was requested and its environment.
Result<wireup::Backend> agent_backend(jobspec::WireupBackend requested, const Environment& env,
                                      const std::vector<std::string>& compiled);

std::string_view backend_name(wireup::Backend backend);  // "tcp", "pmix", "pmi2"

// Variables that describe the agent's own PMI step, not a worker's: left out of the workers'
// environment (PMIX_* but the user's PMIX_MCA_* settings, PMI_*), so a worker never talks to the
// agent's PMI server by mistake.
bool is_agent_pmi_variable(std::string_view name);

// --- the agents' exchange ------------------------------------------------------------------------
// 32 hex digits of SHA-256 over a topology's JSON: equal for identical node descriptions.
std::string topology_fingerprint(std::string_view topology_json);

// One agent's record in the exchange: tab-separated text (version, name, fingerprint, relay,
// allocation). A field that holds a tab or newline cannot travel (Slurm node names never do).
Result<std::string> node_record(const topology::NodeInput& node, std::string_view fingerprint,
                                std::string_view relay_address);

struct AgentExchange {
  // By agent rank (the store's rank); this agent's node is its own NodeTopology, the others with
  // one fingerprint share one object (their description: no hostname, no origin).
  std::vector<topology::NodeInput> nodes;
  std::vector<std::string> relay_addresses;  // each agent's workers' relay, by agent rank
  std::size_t distinct_topologies = 0;
};

// What this agent brings to the exchange: its topology's description (the expensive part, 1.2 ms
// for a DGX H100 here) as JSON, fingerprint and record. The description is the hardware's shape,
// without what names this node (hostname, the file it was read from, GPU UUIDs, port GIDs) and
// with NUMA memory in whole GiB: alike nodes are one description. The record carries the UUIDs.
struct NodeDescription {
  topology::NodeInput node;
  std::shared_ptr<const topology::NodeTopology> described;  // node.topology, less its names
  std::string topology_json;                                // of `described`
  std::string fingerprint;
  std::string record;
};
Result<NodeDescription> describe_node(const topology::NodeInput& node,
                                      std::string_view relay_address);

// The collective exchange over `store` (every agent calls it): an allgather of the records, then,
// when the nodes are not all alike, a fence, a read of the descriptions this agent lacks and a
// fence that keeps every agent (and its relay) in the exchange until all have read.
// Errors name the agent whose record or description is bad.
Result<AgentExchange> exchange_node_inputs(wireup::KvStore& store, const NodeDescription& mine,
                                           wireup::milliseconds timeout);
// describe_node + the above.
Result<AgentExchange> exchange_node_inputs(wireup::KvStore& store, const topology::NodeInput& mine,
                                           std::string_view relay_address,
                                           wireup::milliseconds timeout);

// --- the relay tree ------------------------------------------------------------------------------
inline constexpr int kRelayFanout = 16;
// The agent whose relay is agent's upstream; -1 for agent 0 (its upstream is the root store).
int relay_parent(int agent);
// agent and every agent below it in the tree, ascending.
std::vector<int> relay_subtree(int agent, int agents);

// Starts this agent's relay of the workers' store on `listener` (opened before the exchange, so
// its address could travel in the record): upstream = the parent agent's relay, or root_address
// for agent 0; it stands for the ranks the map places on the nodes of its subtree.
Result<std::unique_ptr<wireup::TcpStoreServer>> start_workers_relay(
    wireup::TcpStoreListener listener, const topology::RankMap& map, const AgentExchange& exchange,
    int agent, const std::string& root_address, const std::string& secret);

// The agents' own TCP store as a tree: this agent's relay (upstream: its parent's relay, whose
// address it reads from the root after publishing its own) and a client of it as agent `agent`.
struct AgentTreeStore {
  std::unique_ptr<wireup::TcpStoreServer> relay;
  std::unique_ptr<wireup::KvStore> store;
};
Result<AgentTreeStore> connect_agents_tree(const std::string& root_address,
                                           const std::string& secret, int agent, int agents,
                                           const std::string& advertised_host,
                                           wireup::milliseconds timeout);

}  // namespace topolaunch::launcher
