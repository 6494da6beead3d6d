// Running a loader in a forked child with one environment variable changed: the loaders of the
// dlopened libraries read the environment and keep what they load for the life of the process,
// so the test process itself stays as it was (run_isolated_output, topolaunch/common/isolated.hpp).
#pragma once

#include <cstdlib>
#include <functional>
#include <string>

#include "topolaunch/common/isolated.hpp"

namespace topolaunch::testing {

// What `probe` returns in a child whose environment has `variable` = `value` (nullptr: unset).
inline Result<std::string> in_child_with(const char* variable, const char* value,
                                         const std::function<Result<std::string>()>& probe) {
  IsolationLimits limits;
  limits.extra_memory_bytes = 1ull << 30;  // UCX and PMIx map a few hundred MiB of address space
  return run_isolated_output(
      [&]() -> Result<std::string> {
        if (value != nullptr)
          ::setenv(variable, value, 1);
        else
          ::unsetenv(variable);
        return probe();
      },
      limits, variable, 1 << 16);
}

}  // namespace topolaunch::testing
