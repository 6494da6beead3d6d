// Checkpoints: parameters + AdamW state + step + data position + RNG, written to a temporary name,
// fsynced, renamed (atomic on POSIX), with a CRC-32 over everything; loading verifies size, magic,
// checksum and the model fingerprint before a single byte reaches the arena, so a torn, corrupt or
// foreign checkpoint is never loaded.
#pragma once

#include <cstdint>
#include <string>

#include "topolaunch/kernels/cpu_backend.hpp"
#include "topolaunch/topology/result.hpp"

namespace topolaunch::kernels {

struct TrainingState {
  std::int64_t step = 0;           // optimizer steps completed
  std::int64_t data_position = 0;  // next token index of the data stream (global over ranks)
  std::uint64_t rng_state = 0;
};

// Hash of the model's parameter names, shapes and dtypes (and the optimizer state layout).
std::uint64_t model_fingerprint(const Graph& graph);

std::string checkpoint_path(const std::string& dir);  // dir/checkpoint.bin

Status write_checkpoint(const std::string& dir, CpuExecutor<float>& executor,
                        const TrainingState& state);
// Errors (exit code 2): truncated, checksum mismatch, different model, not a checkpoint.
Result<TrainingState> load_checkpoint(const std::string& path, CpuExecutor<float>& executor);

}  // namespace topolaunch::kernels
