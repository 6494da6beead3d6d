// Checkpoints: parameters + AdamW state + step + data position + RNG, in generations
// (dir/checkpoint-<step>.bin, the newest `keep` kept). Each is written to a temporary name,
// fsynced, renamed (atomic on POSIX) and its directory fsynced, with a CRC-64 over its whole
// length. Reading opens only regular files whose size is the one this model's checkpoint has,
// and verifies magic, model fingerprint, size, end marker and checksum before a single byte
// reaches the arena, so a torn, corrupt or foreign checkpoint is never loaded. A resume takes the
// newest good generation and names each newer one it skipped and why.
//
// The file holds a backend-neutral view of the training state (checkpoint_layout): named fp32
// tensors, the same for the CPU backend (fp32 parameters) and the CUDA backend (bf16 parameters
// with fp32 master copies: the master values are saved under the parameter's name). So a CPU
// checkpoint of a model loads in the GPU worker and the other way round.
//
// CheckpointWriter takes a copy of the state between steps and writes it on its own thread, so
// the step loop waits for a memory copy, not for the disk.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
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

// CRC-64/XZ (ECMA-182 polynomial, reflected, initial value and final xor all ones): continues
// `crc` (0 to start) over `bytes`; crc64(b, crc64(a)) == crc64(a + b).
std::uint64_t crc64(std::span<const std::byte> bytes, std::uint64_t crc = 0);

// dir/checkpoint-<step, 12 digits>.bin: one generation.
std::string checkpoint_path(const std::string& dir, std::int64_t step);
// dir/checkpoint.bin: the one file of format 1 (CRC-32), written before generations. It still
// resumes (as the oldest candidate) and is pruned like the oldest generation.
std::string legacy_checkpoint_path(const std::string& dir);

struct CheckpointFile {
  std::string path;
  std::int64_t step = -1;  // from the name; -1: the legacy checkpoint.bin
};
// The generations of dir (and a legacy checkpoint.bin), newest first; names only, nothing read.
// An absent dir has none.
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);

// Reads one entry's fp32 values into `out` (resized to entry.elements by the caller).
using ReadCheckpointTensor =
    std::function<Status(const CheckpointEntry& entry, std::span<float> out)>;
// Stores one entry's fp32 values into the backend.
using WriteCheckpointTensor =
    std::function<Status(const CheckpointEntry& entry, std::span<const float> values)>;

// Writes generation state.step of dir synchronously (values read entry by entry, no copy of the
// whole state), then prunes: keeps it and the keep - 1 newest older ones; deletes the rest,
// generations newer than it (an abandoned line: a resume skipped them or train.resume was
// false) and stale temporary files. Returns the path written.
Result<std::string> write_checkpoint(const std::string& dir, const Graph& graph,
                                     const ReadCheckpointTensor& read, const TrainingState& state,
                                     int keep);

// Checks one file without loading it: a regular file (never opened otherwise: a FIFO, a device,
// /dev/zero), a checkpoint of format 1 or 2, of this model, of this model's exact size, its end
// marker and checksum over the whole length. Errors (exit code 2): not a regular file, truncated,
// wrong size, checksum mismatch, different model, not a checkpoint.
Result<TrainingState> verify_checkpoint(const std::string& path, const Graph& graph);
// verify_checkpoint, then each entry through `write` (called only after every check passed).
Result<TrainingState> load_checkpoint(const std::string& path, const Graph& graph,
                                      const WriteCheckpointTensor& write);

struct ResumePoint {
  std::string path;  // the generation loaded
  TrainingState state;
  // One line per newer checkpoint passed over: "checkpoint: skipped <path>: <why>; ...".
  std::vector<std::string> skipped;
};
// The newest good checkpoint of dir, loaded through `write`; nullopt when dir has none. A newer
// one that fails verify_checkpoint is skipped (and named in `skipped`); another model's is an
// error (exit 2: the folder belongs to another job); none good is an error (exit 2) naming each
// file and why, in one line.
Result<std::optional<ResumePoint>> resume_from_newest(const std::string& dir, const Graph& graph,
                                                      const WriteCheckpointTensor& write);

// Sharded state (a plan whose comm.shard is not none): the parts of the layout's entries this
// rank holds, and where: each parameter's (and its .m's and .v's) elements within this rank's
// segment of its bucket, at shard_offset of the bucket's shard tensors; grad_norm whole on rank 0.
struct CheckpointPart {
  enum class Source : std::uint8_t { parameter, m, v, whole };
  std::size_t entry = 0;             // index into checkpoint_layout(graph)
  std::size_t begin = 0, count = 0;  // elements of the entry
  Source source = Source::whole;
  int bucket = -1;
  std::size_t shard_offset = 0;
};
std::vector<CheckpointPart> checkpoint_parts(const Graph& graph, const CommPlan& comm);
// Reads one part's fp32 values (out.size() == part.count).
using ReadCheckpointPart = std::function<Status(const CheckpointPart& part, std::span<float> out)>;
// A collective sum of one number over the ranks (the executor's sum_over_ranks).
using SumOverRanks = std::function<Result<double>(double value)>;
// Sharded state, collective: every rank writes its parts into one file (the unsharded layout,
// so any world size and any shard mode resumes it, each rank loading its own parts): rank 0
// creates the temporary file at its full size, every rank writes its parts and syncs, and rank 0
// then adds the checksum over the whole file, renames it into place and prunes as
// write_checkpoint does. Returns the path (every rank); an error on any rank is every rank's.
Result<std::string> write_checkpoint_parts(const std::string& dir, const Graph& graph,
                                           const std::vector<CheckpointPart>& parts,
                                           const ReadCheckpointPart& read,
                                           const TrainingState& state, int keep, int rank,
                                           const SumOverRanks& sum_over_ranks);

// The CPU backend's view (its tensors are the fp32 values themselves; a sharded plan's reader
// and writer go through the shards).
Result<std::string> write_checkpoint(const std::string& dir, CpuExecutor<float>& executor,
                                     const TrainingState& state, int keep);
Result<TrainingState> load_checkpoint(const std::string& path, CpuExecutor<float>& executor);
Result<std::optional<ResumePoint>> resume_from_newest(const std::string& dir,
                                                      CpuExecutor<float>& executor);
ReadCheckpointTensor read_from_executor(CpuExecutor<float>& executor);
WriteCheckpointTensor write_to_executor(CpuExecutor<float>& executor);
ReadCheckpointPart read_part_from_executor(CpuExecutor<float>& executor);

// Writes generations of one directory, one at a time. Asynchronous (the default): submit copies
// the state into the writer's buffer (one copy of parameters + optimizer state, which the memory
// plan does not count) and returns; its thread writes the file. Synchronous: submit writes the
// file itself (write_checkpoint). Only the process that writes needs one; the thread starts at
// the first asynchronous submit.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, int keep, bool asynchronous = true);
  ~CheckpointWriter();  // waits for the write in flight: a submitted checkpoint is not dropped
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the previous write (one in flight) and returns its error if it failed; then takes
  // the state (read through `read`, in the calling thread) and hands it to the writer.
  Status submit(const Graph& graph, const ReadCheckpointTensor& read, const TrainingState& state);
  Status submit(CpuExecutor<float>& executor, const TrainingState& state);
  // Waits until every submitted checkpoint is renamed into place and synced; the first error of
  // a write not reported yet (an error is reported once).
  Status flush();
  // The last generation completely written ("" = none yet); valid after flush().
  std::string last_written() const;

 private:
  void run();
  void write_pending();

  std::string dir_;
  int keep_;
  bool asynchronous_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool pending_ = false, stopping_ = false;
  std::optional<Error> error_;
  std::string last_written_;
  // The snapshot in flight: header values and the payload in file order.
  std::uint64_t fingerprint_ = 0, tensor_count_ = 0;
  TrainingState state_;
  std::vector<float> payload_;
  std::thread thread_;
};

}  // namespace topolaunch::kernels
