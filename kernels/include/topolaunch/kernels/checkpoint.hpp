// Checkpoints: parameters + AdamW state + step + data position + RNG, written to a temporary name,
// fsynced, renamed (atomic on POSIX), with a CRC-32 over everything; loading verifies size, magic,
// checksum and the model fingerprint before a single byte reaches the arena, so a torn, corrupt or
// foreign checkpoint is never loaded.
//
// The file holds a backend-neutral view of the training state (checkpoint_layout): named fp32
// tensors, the same for the CPU backend (fp32 parameters) and the CUDA backend (bf16 parameters
// with fp32 master copies: the master values are saved under the parameter's name). So a CPU
// checkpoint of a model loads in the GPU worker and the other way round.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/cpu_backend.hpp"

namespace topolaunch::kernels {

struct TrainingState {
  std::int64_t step = 0;           // optimizer steps completed
  std::int64_t data_position = 0;  // next token index of the data stream (global over ranks)
  std::uint64_t rng_state = 0;
};

// One tensor of the checkpoint. `tensor` is the graph tensor to read or write: for a parameter the
// parameter itself (a backend with a master copy reads/writes that copy), otherwise an fp32
// optimizer-state tensor (grad_norm, <param>.m, <param>.v).
struct CheckpointEntry {
  enum class Kind : std::uint8_t { parameter, optimizer_state };
  Kind kind = Kind::parameter;
  TensorId tensor = 0;
  std::string name;  // as saved: the parameter's name, "grad_norm", "<param>.m", "<param>.v"
  std::vector<std::int64_t> shape;
  std::size_t elements = 0;
  std::size_t bytes() const { return elements * sizeof(float); }
};

// File order: every parameter (g.params order), grad_norm, then each parameter's .m and .v.
// (For an all-fp32 CPU graph this is the order and fingerprint the CPU worker always wrote.)
std::vector<CheckpointEntry> checkpoint_layout(const Graph& graph);

// Hash of the layout's names, shapes and (fp32) dtypes.
std::uint64_t model_fingerprint(const Graph& graph);

std::string checkpoint_path(const std::string& dir);  // dir/checkpoint.bin

// Reads one entry's fp32 values into `out` (resized to entry.elements by the caller).
using ReadCheckpointTensor =
    std::function<Status(const CheckpointEntry& entry, std::span<float> out)>;
// Stores one entry's fp32 values into the backend.
using WriteCheckpointTensor =
    std::function<Status(const CheckpointEntry& entry, std::span<const float> values)>;

Status write_checkpoint(const std::string& dir, const Graph& graph,
                        const ReadCheckpointTensor& read, const TrainingState& state);
// Errors (exit code 2): truncated, checksum mismatch, different model, not a checkpoint. `write`
// is called only after every check passed.
Result<TrainingState> load_checkpoint(const std::string& path, const Graph& graph,
                                      const WriteCheckpointTensor& write);

// The CPU backend's view (its tensors are the fp32 values themselves).
Status write_checkpoint(const std::string& dir, CpuExecutor<float>& executor,
                        const TrainingState& state);
Result<TrainingState> load_checkpoint(const std::string& path, CpuExecutor<float>& executor);

}  // namespace topolaunch::kernels
