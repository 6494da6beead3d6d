// Temporary: connectors land in the next commits (tcp_client.cpp, pmix_store.cpp, pmi2_store.cpp).
#include "backends.hpp"

namespace topolaunch::wireup::detail {
Result<std::unique_ptr<KvStore>> connect_tcp(const Env&, milliseconds) {
  return make_error("wireup tcp backend: not implemented yet");
}
Result<std::unique_ptr<KvStore>> connect_pmix(const Env&, milliseconds) {
  return make_error("wireup pmix backend: not implemented yet");
}
Result<std::unique_ptr<KvStore>> connect_pmi2(const Env&, milliseconds) {
  return make_error("wireup pmi2 backend: not implemented yet");
}
}  // namespace topolaunch::wireup::detail
