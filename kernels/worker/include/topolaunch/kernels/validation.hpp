// The loss on the held-out split ([train] val_every, val_batches; data.val_path): the same
// val_batches windows every time (the split's first ones; rank r the r-th B*T slice of each, as in
// training), through the forward alone, averaged over the batches and the ranks. Collective.
#pragma once

#include <cstdint>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/executor.hpp"

namespace topolaunch::kernels {

// How many windows of ranks x batch x seq_len (+1) the split holds, at most `wanted`; an error
// naming data.val_path when it holds none.
Result<std::int64_t> validation_windows(const Dataset& val, const std::string& path,
                                        std::int64_t wanted, std::int64_t batch,
                                        std::int64_t seq_len, int world);

Result<double> validation_loss(TrainingExecutor& executor, const Dataset& val, std::int64_t windows,
                               std::int64_t batch, std::int64_t seq_len);

}  // namespace topolaunch::kernels
