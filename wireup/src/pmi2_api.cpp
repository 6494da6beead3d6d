#include "pmi2_api.hpp"

#include "topolaunch/common/shared_library.hpp"

namespace topolaunch::wireup::detail {

Result<Pmi2Api> load_pmi2_api() {
  auto lib = SharedLibrary::open("TOPOLAUNCH_PMI2_LIBRARY", "libpmi2.so.0");
  if (!lib) return lib.error();
  Pmi2Api api{};
  for (const Status& st : {
           lib->load(api.init, "PMI2_Init"),
           lib->load(api.finalize, "PMI2_Finalize"),
           lib->load(api.job_get_id, "PMI2_Job_GetId"),
           lib->load(api.kvs_put, "PMI2_KVS_Put"),
           lib->load(api.kvs_fence, "PMI2_KVS_Fence"),
           lib->load(api.kvs_get, "PMI2_KVS_Get"),
       })
    if (!st) return st.error();
  return api;
}

const Result<Pmi2Api>& pmi2_api() {
  static const Result<Pmi2Api> loaded = load_pmi2_api();
  return loaded;
}

}  // namespace topolaunch::wireup::detail
