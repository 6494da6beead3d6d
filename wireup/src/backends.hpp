// Private: the per-backend connectors behind connect_from_env().
#pragma once

#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::wireup::detail {

Result<std::unique_ptr<KvStore>> connect_tcp(const Env& env, milliseconds connect_timeout);
Result<std::unique_ptr<KvStore>> connect_pmix(const Env& env, milliseconds connect_timeout);
Result<std::unique_ptr<KvStore>> connect_pmi2(const Env& env, milliseconds connect_timeout);

}  // namespace topolaunch::wireup::detail
