// Choosing the agents' wireup backend; see agent_wireup.hpp.
#include "topolaunch/launcher/agent_wireup.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

namespace topolaunch::launcher {
namespace {

bool contains(const std::vector<std::string>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool has(const wireup::Env& env, const char* name) {
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

Result<std::string> srun_mpi_for(WireupBackend requested, const std::vector<std::string>& offered,
                                 const std::vector<std::string>& compiled) {
  switch (requested) {
    case WireupBackend::tcp:
      return std::string("none");
    case WireupBackend::automatic:
      if (contains(offered, "pmix") && contains(compiled, "pmix")) return std::string("pmix");
      if (contains(offered, "pmi2") && contains(compiled, "pmi2")) return std::string("pmi2");
      return std::string("none");
    case WireupBackend::pmix:
    case WireupBackend::pmi2: {
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

Result<wireup::Backend> agent_backend(WireupBackend requested, const wireup::Env& env,
                                      const std::vector<std::string>& compiled) {
  const bool pmix_env = has(env, "PMIX_RANK") && has(env, "PMIX_NAMESPACE");
  const bool pmi2_env = has(env, "PMI_FD") || has(env, "PMI_RANK");
  const bool tcp_env = has(env, "TOPOLAUNCH_AGENT_STORE");
  switch (requested) {
    case WireupBackend::pmix:
      if (!contains(compiled, "pmix")) return not_compiled("pmix", "libpmix-dev");
      if (!pmix_env) {
        return make_error(
            "wireup.backend = \"pmix\": PMIX_RANK/PMIX_NAMESPACE are not set (the agent was not "
            "started by srun --mpi=pmix)");
      }
      return wireup::Backend::pmix;
    case WireupBackend::pmi2:
      if (!contains(compiled, "pmi2")) return not_compiled("pmi2", "libpmi2-0-dev");
      if (!pmi2_env) {
        return make_error(
            "wireup.backend = \"pmi2\": PMI_FD/PMI_RANK are not set (the agent was not started "
            "by srun --mpi=pmi2)");
      }
      return wireup::Backend::pmi2;
    case WireupBackend::tcp:
      if (!tcp_env) {
        return make_error(
            "wireup.backend = \"tcp\": TOPOLAUNCH_AGENT_STORE is not set (agents are started by "
            "topolaunch run)");
      }
      return wireup::Backend::tcp;
    case WireupBackend::automatic:
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

}  // namespace topolaunch::launcher
