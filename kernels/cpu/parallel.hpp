// Threading policy of the CPU kernels: OpenMP regions only when an op has enough work to pay for
// waking the team (on a busy 2-core box a region on a tiny op costs more than the op itself).
#pragma once

#include <cstdint>

namespace topolaunch::kernels::cpu {

inline constexpr std::int64_t kParallelMinWork = 1 << 16;

}  // namespace topolaunch::kernels::cpu
