#include "pmix_api.hpp"

#include "topolaunch/common/shared_library.hpp"

namespace topolaunch::wireup::detail {

Result<PmixApi> load_pmix_api() {
  auto lib = SharedLibrary::open("TOPOLAUNCH_PMIX_LIBRARY", "libpmix.so.2");
  if (!lib) return lib.error();
  PmixApi api{};
  for (const Status& st : {
           lib->load(api.init, "PMIx_Init"),
           lib->load(api.finalize, "PMIx_Finalize"),
           lib->load(api.put, "PMIx_Put"),
           lib->load(api.commit, "PMIx_Commit"),
           lib->load(api.fence, "PMIx_Fence"),
           lib->load(api.get, "PMIx_Get"),
           lib->load(api.error_string, "PMIx_Error_string"),
           lib->load(api.info_load, "PMIx_Info_load"),
           lib->load(api.value_destruct, "PMIx_Value_destruct"),
       })
    if (!st) return st.error();
  return api;
}

const Result<PmixApi>& pmix_api() {
  static const Result<PmixApi> loaded = load_pmix_api();
  return loaded;
}

}  // namespace topolaunch::wireup::detail
