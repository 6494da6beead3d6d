// Private: the per-backend connectors behind connect_from_env().
#pragma once

#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::wireup::detail {

Result<std::unique_ptr<KvStore>> connect_tcp(const Environment& env, milliseconds connect_timeout);
Result<std::unique_ptr<KvStore>> connect_pmix(const Environment& env, milliseconds connect_timeout);
Result<std::unique_ptr<KvStore>> connect_pmi2(const Environment& env, milliseconds connect_timeout);

}  // namespace topolaunch::wireup::detail
