// libpmix, dlopened on first use (private header): the entry points the PMIx store calls, as
// pmix.h declares them. pmix.h's macros that call PMIx functions (PMIX_INFO_LOAD,
// PMIX_INFO_DESTRUCT, PMIX_VALUE_RELEASE) are replaced by calls through this table.
#pragma once

#include <pmix.h>

#include "topolaunch/common/result.hpp"

namespace topolaunch::wireup::detail {

struct PmixApi {
  decltype(&::PMIx_Init) init;
  decltype(&::PMIx_Finalize) finalize;
  decltype(&::PMIx_Put) put;
  decltype(&::PMIx_Commit) commit;
  decltype(&::PMIx_Fence) fence;
  decltype(&::PMIx_Get) get;
  decltype(&::PMIx_Error_string) error_string;
  decltype(&::PMIx_Info_load) info_load;            // PMIX_INFO_LOAD
  decltype(&::PMIx_Value_destruct) value_destruct;  // PMIX_VALUE_RELEASE, PMIX_INFO_DESTRUCT
};

// Opens libpmix.so.2 ($TOPOLAUNCH_PMIX_LIBRARY overrides the name) and finds every entry point;
// an error names the library and says why. Loads anew on each call (tests); the store uses
// pmix_api().
Result<PmixApi> load_pmix_api();

// The first load_pmix_api()'s result, kept for the life of the process (thread-safe).
const Result<PmixApi>& pmix_api();

}  // namespace topolaunch::wireup::detail
