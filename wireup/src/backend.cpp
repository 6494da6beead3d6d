// Backend choice from the environment (see kv_store.hpp for the order and why).
#include <unistd.h>

#include "backends.hpp"

namespace topolaunch::wireup {
namespace {

bool has(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it != env.end() && !it->second.empty();
}

}  // namespace

std::vector<std::string> compiled_backends() {
  std::vector<std::string> names{"tcp"};
#ifdef TOPOLAUNCH_HAVE_PMIX
  names.emplace_back("pmix");
#endif
#ifdef TOPOLAUNCH_HAVE_PMI2
  names.emplace_back("pmi2");
#endif
  return names;
}

Result<Backend> choose_backend(const Environment& env) {
  if (auto it = env.find("TOPOLAUNCH_WIREUP"); it != env.end() && !it->second.empty()) {
    if (it->second == "tcp") return Backend::tcp;
    if (it->second == "pmix") return Backend::pmix;
    if (it->second == "pmi2") return Backend::pmi2;
    return make_error("TOPOLAUNCH_WIREUP=" + it->second +
                      ": unknown wireup backend (use tcp, pmix or pmi2)");
  }
  if (has(env, "TOPOLAUNCH_STORE_ADDR")) return Backend::tcp;
  if (has(env, "PMIX_RANK") && has(env, "PMIX_NAMESPACE")) return Backend::pmix;
  if (has(env, "PMI_FD") || has(env, "PMI_RANK")) return Backend::pmi2;
  return make_error(
      "no wireup found: set TOPOLAUNCH_STORE_ADDR (tcp store), or run under srun --mpi=pmix or "
      "--mpi=pmi2");
}

Result<std::unique_ptr<KvStore>> connect_from_env(const Environment& env,
                                                  milliseconds connect_timeout) {
  auto backend = choose_backend(env);
  if (!backend) return backend.error();
  switch (*backend) {
    case Backend::tcp:
      return detail::connect_tcp(env, connect_timeout);
    case Backend::pmix:
      return detail::connect_pmix(env, connect_timeout);
    case Backend::pmi2:
      return detail::connect_pmi2(env, connect_timeout);
  }
  return make_error("unreachable wireup backend");
}

}  // namespace topolaunch::wireup
