// libpmi2 (Slurm's), dlopened on first use (private header): the entry points the PMI2 store
// calls, as slurm/pmi2.h declares them.
#pragma once

#include <slurm/pmi2.h>

#include "topolaunch/common/result.hpp"

namespace topolaunch::wireup::detail {

struct Pmi2Api {
  decltype(&::PMI2_Init) init;
  decltype(&::PMI2_Finalize) finalize;
  decltype(&::PMI2_Job_GetId) job_get_id;
  decltype(&::PMI2_KVS_Put) kvs_put;
  decltype(&::PMI2_KVS_Fence) kvs_fence;
  decltype(&::PMI2_KVS_Get) kvs_get;
};

// Opens libpmi2.so.0 ($TOPOLAUNCH_PMI2_LIBRARY overrides the name) and finds every entry point;
// an error names the library and says why. Loads anew on each call (tests); the store uses
// pmi2_api().
Result<Pmi2Api> load_pmi2_api();

// The first load_pmi2_api()'s result, kept for the life of the process (thread-safe).
const Result<Pmi2Api>& pmi2_api();

}  // namespace topolaunch::wireup::detail
