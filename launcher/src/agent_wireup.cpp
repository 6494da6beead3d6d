// Choosing the agents' wireup backend, their exchange and the relay tree; see agent_wireup.hpp.
#include "topolaunch/launcher/agent_wireup.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <sstream>

#include "topolaunch/topology/serialize.hpp"
#include "topolaunch/wireup/digest.hpp"

namespace topolaunch::launcher {
namespace {

bool contains(const std::vector<std::string>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool has(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it != env.end() && !it->second.empty();
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none listed" : out;
}

Error not_compiled(std::string_view name, std::string_view package) {
  return make_error(
      fmt::format("wireup.backend = \"{}\": this topolaunch was built without {} "
                  "support (install {} and rebuild, or use \"auto\" or \"tcp\")",
                  name, name == "pmix" ? "PMIx" : "PMI2", package));
}

}  // namespace

std::vector<std::string> parse_srun_mpi_list(std::string_view text) {
  std::vector<std::string> names;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    const auto last = line.find_last_not_of(" \t\r");
    std::string word = line.substr(first, last - first + 1);
    // Plugin names are single words; the header and the versions line have spaces or colons.
    if (word.find_first_of(" :.") != std::string::npos) continue;
    if (word.rfind("srun", 0) == 0) continue;
    names.push_back(word);
  }
  return names;
}

Result<std::string> srun_mpi_for(jobspec::WireupBackend requested,
                                 const std::vector<std::string>& offered,
                                 const std::vector<std::string>& compiled) {
  switch (requested) {
    case jobspec::WireupBackend::tcp:
      return std::string("none");
    case jobspec::WireupBackend::automatic:
      if (contains(offered, "pmix") && contains(compiled, "pmix")) return std::string("pmix");
      if (contains(offered, "pmi2") && contains(compiled, "pmi2")) return std::string("pmi2");
      return std::string("none");
    case jobspec::WireupBackend::pmix:
    case jobspec::WireupBackend::pmi2: {
      const std::string name(to_string(requested));
      if (!contains(compiled, name))
        return not_compiled(name, name == "pmix" ? "libpmix-dev" : "libpmi2-0-dev");
      if (!contains(offered, name)) {
        return make_error(fmt::format(
            "wireup.backend = \"{}\": this Slurm's srun has no {} plugin (srun --mpi=list: {}); "
            "use \"auto\" or \"tcp\"",
            name, name, joined(offered)));
      }
      return name;
    }
  }
  return make_error("wireup.backend: unknown backend");
}

Result<wireup::Backend> agent_backend(jobspec::WireupBackend requested, const Environment& env,
                                      const std::vector<std::string>& compiled) {
  const bool pmix_env = has(env, "PMIX_RANK") && has(env, "PMIX_NAMESPACE");
  const bool pmi2_env = has(env, "PMI_FD") || has(env, "PMI_RANK");
  const bool tcp_env = has(env, "TOPOLAUNCH_AGENT_STORE");
  switch (requested) {
    case jobspec::WireupBackend::pmix:
      if (!contains(compiled, "pmix")) return not_compiled("pmix", "libpmix-dev");
      if (!pmix_env) {
        return make_error(
            "wireup.backend = \"pmix\": PMIX_RANK/PMIX_NAMESPACE are not set (the agent was not "
            "started by srun --mpi=pmix)");
      }
      return wireup::Backend::pmix;
    case jobspec::WireupBackend::pmi2:
      if (!contains(compiled, "pmi2")) return not_compiled("pmi2", "libpmi2-0-dev");
      if (!pmi2_env) {
        return make_error(
            "wireup.backend = \"pmi2\": PMI_FD/PMI_RANK are not set (the agent was not started "
            "by srun --mpi=pmi2)");
      }
      return wireup::Backend::pmi2;
    case jobspec::WireupBackend::tcp:
      if (!tcp_env) {
        return make_error(
            "wireup.backend = \"tcp\": TOPOLAUNCH_AGENT_STORE is not set (agents are started by "
            "topolaunch run)");
      }
      return wireup::Backend::tcp;
    case jobspec::WireupBackend::automatic:
      if (pmix_env && contains(compiled, "pmix")) return wireup::Backend::pmix;
      if (pmi2_env && contains(compiled, "pmi2")) return wireup::Backend::pmi2;
      if (tcp_env) return wireup::Backend::tcp;
      return make_error(
          "wireup.backend = \"auto\": no PMIx or PMI2 in the agent's environment and no "
          "TOPOLAUNCH_AGENT_STORE (agents are started by topolaunch run)");
  }
  return make_error("wireup.backend: unknown backend");
}

std::string_view backend_name(wireup::Backend backend) {
  switch (backend) {
    case wireup::Backend::tcp:
      return "tcp";
    case wireup::Backend::pmix:
      return "pmix";
    case wireup::Backend::pmi2:
      return "pmi2";
  }
  return "?";
}

bool is_agent_pmi_variable(std::string_view name) {
  if (name.rfind("PMIX_MCA_", 0) == 0) return false;  // the user's PMIx tuning, for workers too
  return name.rfind("PMIX_", 0) == 0 || name.rfind("PMI_", 0) == 0;
}

std::string topology_fingerprint(std::string_view topology_json) {
  return wireup::sha256_hex(topology_json, 16);
}

namespace {

constexpr std::string_view kRecordVersion = "r2";
constexpr std::size_t kRecordFields = 10;

template <class T>
std::string joined_list(const std::vector<T>& items) {
  std::string out;
  for (const auto& item : items) out += fmt::format("{}{}", out.empty() ? "" : ",", item);
  return out;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  std::size_t begin = 0;
  for (;;) {
    const auto end = text.find(separator, begin);
    if (end == std::string_view::npos) {
      parts.push_back(text.substr(begin));
      return parts;
    }
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
}

}  // namespace

Result<std::string> node_record(const topology::NodeInput& node, std::string_view fingerprint,
                                std::string_view relay_address) {
  // The GPUs' UUIDs travel here, not in the description, so that alike nodes share one.
  std::vector<std::string> uuids;
  bool any_uuid = false;
  for (const topology::Gpu& gpu : node.topology->gpus) {
    if (gpu.uuid.find(',') != std::string::npos) {
      return make_error(fmt::format(
          "node {}: GPU UUID '{}' cannot travel in the agents' exchange (it holds a comma)",
          node.name, gpu.uuid));
    }
    any_uuid = any_uuid || !gpu.uuid.empty();
    uuids.push_back(gpu.uuid);
  }
  const std::string fields[kRecordFields] = {
      std::string(kRecordVersion),
      node.name,
      std::string(fingerprint),
      std::string(relay_address),
      node.allocation.all_gpus ? "1" : "0",
      joined_list(node.allocation.gpus),
      joined_list(node.allocation.gpu_uuids),
      std::to_string(static_cast<int>(node.allocation.cuda_naming)),
      node.allocation.cpus ? node.allocation.cpus->to_list() : std::string("*"),
      any_uuid ? joined_list(uuids) : std::string()};
  std::string out;
  for (const auto& field : fields) {
    if (field.find_first_of("\t\n") != std::string::npos) {
      return make_error(fmt::format(
          "node {}: '{}' cannot travel in the agents' exchange (it holds a tab or newline)",
          node.name, field));
    }
    if (!out.empty()) out += '\t';
    out += field;
  }
  return out;
}

namespace {

struct NodeRecord {
  topology::NodeInput node;  // without its topology
  std::string fingerprint;
  std::string relay;
};

// Parsed by every agent for every node (1,024 x 1,024 on one host in the simulation), so plain
// text split on tabs: a JSON record took ~3 us, 3 s of CPU for the whole job there.
Result<NodeRecord> parse_node_record(std::span<const std::byte> bytes, int agent) {
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const auto fields = split(text, '\t');
  auto bad = [&](std::string_view what) {
    return make_error(fmt::format("agent {}: bad node record ({})", agent, what), 1);
  };
  auto number = [](std::string_view item, int& out) {
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), out);
    return ec == std::errc() && end == item.data() + item.size() && out >= 0;
  };
  if (fields.size() != kRecordFields || fields[0] != kRecordVersion)
    return bad("not a record of this version");
  NodeRecord record;
  record.node.name = std::string(fields[1]);
  record.fingerprint = std::string(fields[2]);
  record.relay = std::string(fields[3]);
  if (record.node.name.empty()) return bad("no node name");
  if (record.fingerprint.size() != 32) return bad("no fingerprint");
  if (fields[4] != "0" && fields[4] != "1") return bad("all_gpus");
  record.node.allocation.all_gpus = fields[4] == "1";
  if (!fields[5].empty()) {
    for (auto item : split(fields[5], ',')) {
      int gpu = -1;
      if (!number(item, gpu)) return bad("gpus");
      record.node.allocation.gpus.push_back(gpu);
    }
  }
  if (!fields[6].empty()) {
    for (auto item : split(fields[6], ',')) record.node.allocation.gpu_uuids.emplace_back(item);
  }
  int naming = -1;
  if (!number(fields[7], naming) || naming > static_cast<int>(topology::CudaNaming::uuid))
    return bad("cuda_naming");
  record.node.allocation.cuda_naming = static_cast<topology::CudaNaming>(naming);
  if (fields[8] != "*") {
    auto cpus = topology::CpuSet::parse_list(fields[8]);
    if (!cpus) return bad("cpus");
    record.node.allocation.cpus = std::move(*cpus);
  }
  if (!fields[9].empty()) {
    for (auto item : split(fields[9], ',')) record.node.gpu_uuids.emplace_back(item);
  }
  return record;
}

std::string description_key(const std::string& fingerprint, int owner) {
  // Named after its owner: PMIx finds a "name/<rank>" key in that rank's data at once.
  return wireup::rank_key("topo/" + fingerprint, owner);
}

}  // namespace

Result<NodeDescription> describe_node(const topology::NodeInput& node,
                                      std::string_view relay_address) {
  NodeDescription out;
  out.node = node;
  // With the names in, every node is its own description wherever each has its own file (the
  // plugin's topology_xml=DIR/%n.xml): 32 emulated nodes of three types were 32 descriptions, and
  // each agent fetched 31 x 15 KB through the relays and parsed them (16 ms of CPU per agent).
  // On live nodes alike ones still differ in GPU UUIDs (the record carries them), port GIDs and
  // the NUMA nodes' memory by a few MiB (kernel reservations); the rank map reads no GID and no
  // memory size, so the description holds the hardware's shape: no GIDs, memory in whole GiB.
  auto described = std::make_shared<topology::NodeTopology>(*node.topology);
  described->hostname.clear();
  described->sources.origin.clear();
  for (topology::Gpu& gpu : described->gpus) gpu.uuid.clear();
  for (topology::Nic& nic : described->nics) {
    for (topology::NicPort& port : nic.ports) port.gids.clear();
  }
  constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
  for (topology::NumaNode& numa : described->numa_nodes) {
    numa.memory_bytes = numa.memory_bytes / kGiB * kGiB;
  }
  out.described = std::move(described);
  out.topology_json = topology::to_json(*out.described);
  out.fingerprint = topology_fingerprint(out.topology_json);
  auto record = node_record(node, out.fingerprint, relay_address);
  if (!record) return record.error();
  out.record = std::move(*record);
  return out;
}

Result<AgentExchange> exchange_node_inputs(wireup::KvStore& store, const topology::NodeInput& mine,
                                           std::string_view relay_address,
                                           wireup::milliseconds timeout) {
  auto described = describe_node(mine, relay_address);
  if (!described) return described.error();
  return exchange_node_inputs(store, *described, timeout);
}

Result<AgentExchange> exchange_node_inputs(wireup::KvStore& store, const NodeDescription& me,
                                           wireup::milliseconds timeout) {
  const std::string& my_json = me.topology_json;
  const std::string& my_fingerprint = me.fingerprint;
  auto gathered = store.allgather(
      "node", std::as_bytes(std::span(me.record.data(), me.record.size())), timeout);
  if (!gathered) return gathered.error();
  const int agents = store.size();
  if (static_cast<int>(gathered->size()) != agents) {
    return make_error(fmt::format("the agents' exchange returned {} records for {} agents",
                                  gathered->size(), agents),
                      1);
  }
  std::vector<NodeRecord> records;
  records.reserve(gathered->size());
  std::map<std::string, int> owner;  // fingerprint -> the first agent that has it
  for (int agent = 0; agent < agents; ++agent) {
    auto parsed = parse_node_record((*gathered)[agent], agent);
    if (!parsed) return parsed.error();
    owner.emplace(parsed->fingerprint, agent);
    records.push_back(std::move(*parsed));
  }
  std::map<std::string, std::shared_ptr<const topology::NodeTopology>> topologies;
  topologies[my_fingerprint] = me.described;
  if (owner.size() > 1) {
    // Every agent knows the same owners: only they put, once per distinct description.
    if (owner.at(my_fingerprint) == store.rank()) {
      if (auto s = store.put(description_key(my_fingerprint, store.rank()), my_json); !s)
        return s.error();
    }
    if (auto s = store.fence(timeout); !s) return s.error();
    std::vector<std::string> keys, wanted;
    for (const auto& [fingerprint, agent] : owner) {
      if (fingerprint == my_fingerprint) continue;
      keys.push_back(description_key(fingerprint, agent));
      wanted.push_back(fingerprint);
    }
    auto descriptions = store.get_many(keys, timeout);
    if (!descriptions) return descriptions.error();
    // The TCP store's relays are the agents' own (connect_agents_tree): an agent that went on and
    // ended (its workers done) took its relay with it while its subtree's reads were still under
    // way ("get_many: connection closed by the store"). No agent leaves before all have read.
    if (auto s = store.fence(timeout); !s) return s.error();
    for (std::size_t i = 0; i < wanted.size(); ++i) {
      const auto& bytes = (*descriptions)[i];
      const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      const int agent = owner.at(wanted[i]);
      if (topology_fingerprint(text) != wanted[i]) {
        return make_error(fmt::format("agent {}: its topology does not match its fingerprint {}",
                                      agent, wanted[i]),
                          1);
      }
      auto topo = topology::from_json(text, fmt::format("agent {}", agent));
      if (!topo) return topo.error();
      topologies[wanted[i]] = std::make_shared<const topology::NodeTopology>(std::move(*topo));
    }
  }
  AgentExchange out;
  out.distinct_topologies = owner.size();
  for (int agent = 0; agent < agents; ++agent) {
    NodeRecord& record = records[static_cast<std::size_t>(agent)];
    record.node.topology =
        agent == store.rank() ? me.node.topology : topologies.at(record.fingerprint);
    out.nodes.push_back(std::move(record.node));
    out.relay_addresses.push_back(std::move(record.relay));
  }
  return out;
}

int relay_parent(int agent) { return agent <= 0 ? -1 : (agent - 1) / kRelayFanout; }

std::vector<int> relay_subtree(int agent, int agents) {
  std::vector<int> out;
  std::vector<int> frontier{agent};
  while (!frontier.empty()) {
    std::vector<int> next;
    for (int a : frontier) {
      if (a >= agents) continue;
      out.push_back(a);
      for (int c = 1; c <= kRelayFanout; ++c) {
        const long child = static_cast<long>(a) * kRelayFanout + c;
        if (child < agents) next.push_back(static_cast<int>(child));
      }
    }
    frontier = std::move(next);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::unique_ptr<wireup::TcpStoreServer>> start_workers_relay(
    wireup::TcpStoreListener listener, const topology::RankMap& map, const AgentExchange& exchange,
    int agent, const std::string& root_address, const std::string& secret) {
  const int agents = static_cast<int>(exchange.nodes.size());
  std::set<std::string> names;
  for (int a : relay_subtree(agent, agents)) names.insert(exchange.nodes[a].name);
  wireup::TcpStoreServerOptions options;
  options.secret = secret;
  options.world_size = map.world_size;
  for (const auto& node : map.nodes) {
    if (names.count(node.name) != 0)
      options.ranks.insert(options.ranks.end(), node.rank_ids.begin(), node.rank_ids.end());
  }
  std::sort(options.ranks.begin(), options.ranks.end());
  const int parent = relay_parent(agent);
  options.upstream = parent < 0 ? root_address : exchange.relay_addresses.at(parent);
  if (options.upstream.empty()) {
    return make_error(fmt::format("agent {} published no relay address", parent), 1);
  }
  auto relay = wireup::TcpStoreServer::start(options, std::move(listener));
  if (!relay) return make_error("workers' relay: " + relay.error().message, 1);
  return std::move(*relay);
}

Result<AgentTreeStore> connect_agents_tree(const std::string& root_address,
                                           const std::string& secret, int agent, int agents,
                                           const std::string& advertised_host,
                                           wireup::milliseconds timeout) {
  auto listener = wireup::TcpStoreListener::open("0.0.0.0");
  if (!listener) return make_error("agents' relay: " + listener.error().message, 1);
  const std::uint16_t port = listener->port();
  // Publish this relay, read the parent's: small requests to the root, not a collective.
  wireup::TcpStoreClientOptions root_options;
  root_options.address = root_address;
  root_options.secret = secret;
  root_options.rank = -1;
  root_options.world_size = agents;
  root_options.connect_timeout = timeout;
  auto root = wireup::TcpStoreClient::connect(root_options);
  if (!root) return root.error();
  const std::string mine = fmt::format("{}:{}", advertised_host, port);
  const std::string key_prefix = "relay/agents";
  if (auto s = (*root)->set(wireup::rank_key(key_prefix, agent),
                            std::as_bytes(std::span(mine.data(), mine.size())));
      !s) {
    return s.error();
  }
  std::string upstream = root_address;
  if (const int parent = relay_parent(agent); parent >= 0) {
    auto address = (*root)->get_string(wireup::rank_key(key_prefix, parent), timeout);
    if (!address) return address.error();
    upstream = *address;
  }
  root->reset();
  wireup::TcpStoreServerOptions options;
  options.secret = secret;
  options.world_size = agents;
  options.upstream = upstream;
  options.ranks = relay_subtree(agent, agents);
  options.upstream_connect_timeout = timeout;
  AgentTreeStore out;
  auto relay = wireup::TcpStoreServer::start(options, std::move(*listener));
  if (!relay) return make_error("agents' relay: " + relay.error().message, 1);
  out.relay = std::move(*relay);
  wireup::TcpStoreClientOptions client_options;
  client_options.address = fmt::format("127.0.0.1:{}", port);
  client_options.secret = secret;
  client_options.rank = agent;
  client_options.world_size = agents;
  client_options.connect_timeout = timeout;
  auto client = wireup::TcpStoreClient::connect(client_options);
  if (!client) return client.error();
  out.store = std::move(*client);
  return out;
}

}  // namespace topolaunch::launcher
