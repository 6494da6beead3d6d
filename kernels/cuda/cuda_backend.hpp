// The CUDA backend: the GPU twin of CpuExecutor (cpu_backend.hpp). It runs the SAME compiled plan
// (graph built with Precision::cuda_bf16(), offsets from the CPU planner) over ONE arena that is
// cudaMalloc'ed once; every op of the plan's list is dispatched to the kernels of kernels/cuda.
// Mixed precision as those kernels take it: bf16 activations, activation gradients and working
// copy of the parameters; fp32 parameter gradients, master weights, AdamW moments, LayerNorm
// statistics, attention log-sum-exp and per-token losses.
//
// The whole training step (forward, backward, bucketed all-reduce, optimizer) is captured once as
// a CUDA Graph and replayed; the per-step scalars (learning rate, AdamW step, clip, loss scale)
// live in the arena and are copied in before the launch, so nothing is host-synchronised inside a
// step. ExecutionMode::op_by_op launches the same plan kernel by kernel (the comparison baseline).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/optimizer.hpp"
#include "topolaunch/kernels/plan.hpp"

namespace topolaunch::kernels::cuda {

struct Fp8Scaling;  // fp8.cuh

class Matmul;
class CudnnAttention;

// Data-parallel gradient reduction on the GPU (the NCCL implementation lives in
// kernels/cuda/nccl_communicator.*). The executor calls all_reduce_sum once per gradient bucket of
// the plan (plan.comm.buckets: one contiguous fp32 range of the arena each), on its communication
// side stream, after that stream waited for the event recorded when the bucket's last gradient was
// written. The call must only ENQUEUE work on `stream` (no host synchronisation, no allocation):
// it is captured into the step's CUDA Graph like every kernel, and all ranks capture and replay
// the same sequence of calls.
class GpuCommunicator {
 public:
  virtual ~GpuCommunicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In place: data[0..count) = sum over ranks of data[0..count) (fp32).
  virtual cudaError_t all_reduce_sum(float* data, std::size_t count, cudaStream_t stream) = 0;
  // Sharded plans (plan.hpp, ShardMode). count is a multiple of world_size(); segment r is
  // [r*count/n, (r+1)*count/n). reduce_scatter_sum: in place, this rank's segment becomes the sum
  // over ranks of that segment (the others are left unspecified). all_gather: data[0..count) (bf16)
  // becomes every rank's segment, `shard` being this rank's (data's own segment, or elsewhere).
  virtual cudaError_t reduce_scatter_sum(float* data, std::size_t count, cudaStream_t stream) = 0;
  virtual cudaError_t all_gather(__nv_bfloat16* data, const __nv_bfloat16* shard, std::size_t count,
                                 cudaStream_t stream) = 0;
};

enum class ExecutionMode : std::uint8_t {
  graph,     // capture each distinct op range once as a CUDA Graph, then replay it
  op_by_op,  // launch the plan's kernels one by one on every call
};

// Which causal attention the executor runs: our kernels (attention.cuh), cuDNN's fused attention
// (attention_cudnn.cuh; only in builds that found libcudnn 9), or auto: both timed at
// creation on the plan's attention shape (forward + backward, CUDA events, in the arena before it
// is zeroed) and the faster kept; auto falls back to own, with the reason, when cuDNN is not built
// or refuses the shape.
enum class AttentionImpl : std::uint8_t { auto_select, own, cudnn };
const char* attention_impl_name(AttentionImpl impl);  // "auto", "own", "cudnn"

// What the executor chose for attention, and the timings it chose by (0: not timed).
struct AttentionChoice {
  AttentionImpl chosen = AttentionImpl::own;  // own or cudnn
  double own_fwd_ms = 0, own_bwd_ms = 0;      // median of the timed reps, one op
  double cudnn_fwd_ms = 0, cudnn_bwd_ms = 0;  // the selected engine configurations'
  // cuDNN's engine configurations for the graph, in its heuristic order, each timed (auto): ms,
  // or -1 where one did not run (its workspace does not fit where the first's does, or it failed);
  // the selected ones' indexes.
  std::vector<double> cudnn_fwd_candidates_ms, cudnn_bwd_candidates_ms;
  int cudnn_fwd_candidate = 0, cudnn_bwd_candidate = 0;
  std::string cudnn_fwd_config, cudnn_bwd_config;  // CudnnAttention::candidate_description
  std::string reason;         // one line: why this one (e.g. the cuDNN error auto fell back on)
  std::string cudnn_version;  // "cuDNN 9.14.0, backend API, engines .." when cuDNN was set up
  std::size_t cudnn_workspace_bytes = 0;  // workspace cuDNN's graphs need (0: cuDNN not chosen)
  // The plan's attention workspaces hold it (PlanOptions::fused_attention_workspace): no device
  // memory outside the arena but cuDNN's handle. Otherwise one separate allocation of
  // cudnn_workspace_bytes (DeviceMemory::attention_workspace_bytes).
  bool cudnn_workspace_planned = false;
  int cudnn_backward_ops = 0;  // attention backwards run by cuDNN (the first writers of dqkv)
  int own_backward_ops = 0;    // attention backwards run by our kernel (accumulating)
};

struct CudaExecutorOptions {
  ExecutionMode mode = ExecutionMode::graph;
  AttentionImpl attention = AttentionImpl::auto_select;
  // Fuse crossentropy_forward with the crossentropy_backward that directly follows it (one read of
  // the logits, dlogits written in place; the plan already gives both the same buffer).
  bool fuse_classifier = true;
  // Skip the plan's zero of a gradient whose first writer can overwrite it instead of
  // accumulating (gelu_backward, matmul_backward's dx through a beta-0 GEMM): saves a memset and
  // a read per such gradient.
  bool overwrite_first_gradient = true;
  // All the plan's AdamW ops as ONE multi-tensor launch (at the first of them; a device table of
  // the tensors built once) instead of one launch per parameter; same results bit for bit.
  bool multi_tensor_adamw = true;
  // GELU in the GEMM epilogues (cuBLASLt GELU_AUX_BIAS forward, DGELU backward): an MLP's
  // matmul_forward computes the GELU output with its pre-activation, and the backward GEMM of the
  // projection after it writes the pre-activation's gradient directly; the separate gelu kernels
  // (a read and a write of a (B,T,4C) tensor each way) are skipped. Only where the plan allows it
  // (see fuse_gelu_pairs in cuda_backend.cu).
  bool fuse_gelu = true;
  // A matmul_backward's bias gradient (the column sums of its dy) taken by the layernorm_backward
  // that last wrote dy as it writes it (the residual stream's gradient: GPT-2's attention and MLP
  // projections), instead of a separate pass over dy. See fuse_bias_gradients().
  bool fuse_bias_gradients = true;
  // The bucket all-reduces' side stream at the device's greatest stream priority (and the step's
  // graph instantiated to honour per-node priorities), so that NCCL's kernels get SMs ahead of
  // the backward's blocks instead of queueing behind them.
  bool comm_stream_high_priority = false;
  // op_by_op only: CUDA events around every op, read back with op_times_ms() (where the step's
  // time goes, by op).
  bool profile_ops = false;
  // train.precision = "fp8": the GEMMs of the transformer blocks may run in FP8 with delayed
  // per-tensor scaling (fp8.cuh): the forward (E4M3 activations and weights), the activation
  // gradient (E5M2 gradients, E4M3 weights) and the weight gradient (E5M2 dy^T, E4M3 x^T, fp32
  // accumulation into dW); the classifier, attention, the optimizer (fp32 master weights) and
  // everything else stay as in bf16. A GEMM cuBLASLt has no FP8 kernel for runs in bf16
  // (fp8_report()).
  bool fp8 = false;
  // fp8: which of those GEMMs run in FP8. measured: at an op's first eager use its variants (a
  // forward: FP8 or bf16; a backward: dx and dW each either way) are timed whole, casts
  // included, and FP8 is kept only where it pays at least kFp8MinGain per FP8 GEMM (a cast is a
  // pass over the operand: for a short K or a small GEMM, bf16 wins; cuBLASLt's FP8 kernels with
  // the DGELU epilogue run at a third of bf16's speed). always: every one in FP8 (the numerics
  // tests).
  enum class Fp8Choice : std::uint8_t { measured, always };
  Fp8Choice fp8_choice = Fp8Choice::measured;
  static constexpr double kFp8MinGain = 0.02;
};

// What fp8 changed (CudaExecutor::fp8_report()).
struct Fp8Report {
  int gemm_ops = 0;      // matmul ops of the plan whose GEMMs run in FP8
  int fallback_ops = 0;  // eligible ones cuBLASLt had no FP8 kernel for (bf16 instead)
  // known after the first step: of the eligible ops' FP8-capable GEMMs (a forward; a
  // backward's dx and dW), how many run in FP8 and how many measured faster in bf16
  int fp8_gemms = 0;
  int bf16_by_measurement = 0;
  int bf16_ops = 0;               // not eligible (the classifier, shapes not multiples of 16)
  std::size_t scratch_bytes = 0;  // the casts' buffers and scaling state, outside the arena
  std::string first_fallback;     // the first refusal: op, direction, cuBLASLt status
};

// Per-step figures of the device.
struct DeviceMemory {
  std::size_t arena_bytes = 0;                // the one arena (plan.memory.arena_bytes)
  std::size_t workspace_bytes = 0;            // cuBLASLt workspace
  std::size_t attention_workspace_bytes = 0;  // cuDNN's workspace outside the arena (0: planned
                                              // in the arena, or our kernels)
  std::size_t fp8_scratch_bytes = 0;          // fp8: the cast operands and their scaling state
  std::size_t host_bytes = 0;  // offloaded optimizer state: pinned host memory (plan.memory)
  std::size_t used_bytes = 0;  // cudaMemGetInfo: total - free, now (context included)
  std::size_t total_bytes = 0;
};

class CudaExecutor {
 public:
  // Validates the plan's dtypes against the kernels, allocates and zeroes the arena on the current
  // device. `communicator` may be null (single GPU); it must outlive the executor.
  static Result<std::unique_ptr<CudaExecutor>> create(const Plan& plan,
                                                      const CudaExecutorOptions& options = {},
                                                      GpuCommunicator* communicator = nullptr);
  ~CudaExecutor();
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  const Plan& plan() const { return plan_; }
  const CudaExecutorOptions& options() const { return options_; }
  cudaStream_t stream() const { return stream_; }
  // Device address of tensor t in the arena (nullptr when the plan gives it no offset).
  void* device_pointer(TensorId t) const;

  // GPT-2 init, the same values as CpuExecutor<float>::init_parameters(seed) (same RNG, same
  // order): written to the fp32 master copy and rounded into the bf16 working copy.
  Status init_parameters(std::uint64_t seed);
  // One parameter from fp32 host values (master copy + bf16 working copy). A sharded plan keeps
  // this rank's part of the master (and, ZeRO-3, of the working copy; ZeRO-1/2 hold all of it).
  Status set_parameter(TensorId param, std::span<const float> values);
  // Elements [offset, offset + out.size()) of an fp32 tensor (a shard), to the host / from it;
  // synchronise the stream.
  Status read_values(TensorId t, std::size_t offset, std::span<float> out);
  Status write_values(TensorId t, std::size_t offset, std::span<const float> values);
  // The fp32 master copy of a parameter (the bf16 working copy when it has none).
  Result<std::vector<float>> parameter(TensorId param);
  // Any float tensor (bf16 or fp32) copied to the host as float; synchronises the stream.
  Result<std::vector<float>> values(TensorId t);
  // An fp32 tensor (AdamW moments, master weights: what a checkpoint restores) from host values;
  // synchronises the stream. Parameters go through set_parameter (it refreshes the bf16 copy).
  Status set_values(TensorId t, std::span<const float> values);

  // Tokens and targets of the next micro-step (B*T each), staged in pinned memory and copied
  // asynchronously before the next launch.
  Status set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets);
  void set_loss_scale(double scale);

  // One whole optimizer step: forward, backward (bucket all-reduces on the side stream when a
  // communicator with world_size > 1 is given), global norm, AdamW, zero grads. `step` 1-based.
  Status train_step(const AdamWSettings& settings, std::int64_t step);
  // Gradient accumulation: forward + backward only (all-reduce when `communicate`); finish the
  // step with run_optimizer.
  Status run_forward_backward(bool communicate);
  Status run_optimizer(const AdamWSettings& settings, std::int64_t step);
  // The forward ops only (loss of the current batch; the logits stay intact: no fused classifier).
  Status run_forward();

  Status synchronize();
  Result<double> mean_loss();  // mean per-token loss of the last forward (synchronises)
  Result<double> last_grad_norm();
  // Optimizer steps skipped since this executor was created: a step whose global gradient norm is
  // inf or nan leaves the parameters and AdamW's moments as they were, and AdamW's step t counts
  // only the steps applied (synchronises).
  Result<std::int64_t> skipped_steps();

  DeviceMemory memory() const;
  Fp8Report fp8_report() const;
  // The attention implementation in use and the timings behind an auto choice.
  const AttentionChoice& attention_choice() const { return attention_choice_; }
  // profile_ops: GPU milliseconds of each op of the plan in the last launch that ran it (0 for
  // ops not run, or fused into the previous one). Synchronises.
  Result<std::vector<double>> op_times_ms();
  // How op `index` of the plan runs in a whole-step launch: inside which op's launch (itself, the
  // GEMM whose epilogue computes a fused gelu, the crossentropy_forward of a fused classifier, the
  // first adamw of the one multi-tensor launch), or not at all (a zero skipped because the first
  // writer overwrites); and whether it overwrites its (first) output instead of accumulating.
  static constexpr std::size_t kNotRun = static_cast<std::size_t>(-1);
  struct OpExecution {
    std::size_t runs_in = kNotRun;
    bool overwrites = false;
  };
  OpExecution execution_of(std::size_t index) const;
  // Kernel/memset/event nodes of the captured whole-step graph (0 before the first capture).
  std::size_t graph_nodes() const { return graph_nodes_; }
  std::size_t graphs_captured() const { return graphs_.size(); }
  // fuse_gelu: gelu ops run inside a GEMM's epilogue (forward and backward ones).
  std::size_t gelu_ops_fused() const {
    std::size_t n = 0;
    for (auto j : gelu_partner_) n += j != kNoPartner ? 1 : 0;
    return n;
  }
  // matmul_backward bias gradients taken over by dy's writer (fuse_bias_gradients)
  std::size_t bias_gradients_fused() const {
    return static_cast<std::size_t>(std::count(bias_taken_.begin(), bias_taken_.end(), 1));
  }
  // Host time of the last launch (graph launch, or every kernel launch op by op; capture included
  // the first time), not counting the staging copies before it.
  double last_launch_host_ms() const { return last_launch_host_ms_; }

  // Tracing (the worker's [observe] trace_steps): from set_tracing(true) on, each launch runs its
  // range's traced variant, captured as a graph of its own, which records a CUDA event before and
  // after each op on the compute stream and around each bucket all-reduce on the communication
  // stream (external event nodes, re-recorded by every replay); set_tracing(false) goes back to
  // the ranges' own graphs, which were never changed. The times are read with traced_times().
  Status set_tracing(bool on);
  struct TracedTimes {
    // Per op of the plan and per bucket: start and end, in ms after set_tracing(true) reached the
    // stream; {-1, -1} for an op not run by itself (fused into another's launch) or not launched.
    std::vector<std::pair<double, double>> ops, buckets;
    double end_ms = 0;  // the latest end
  };
  // The traced launches' times since set_tracing(true); synchronises the stream.
  Result<TracedTimes> traced_times();

 private:
  CudaExecutor(const Plan& plan, const CudaExecutorOptions& options, GpuCommunicator* comm);
  Status init();
  Status choose_attention();
  Result<double> time_attention(bool cudnn, bool backward);
  Status select_cudnn_candidates();
  void fuse_bias_gradients();
  Status upload_pending();
  Status run_range(std::size_t begin, std::size_t end, bool communicate);
  Status launch_range(std::size_t begin, std::size_t end, bool communicate);
  Status enqueue_range(std::size_t begin, std::size_t end, bool communicate);
  Status enqueue_op(std::size_t index, bool communicate, bool fuse, bool& joined);
  Status join_communication();
  // fp8: sites and scratch at init; the two GEMM ops through their FP8 casts (false in *done:
  // the op runs in bf16: not eligible, or cuBLASLt refused the FP8 call at its first use).
  Status init_fp8();
  // Op `index`'s two cast sites and operand buffers (the first operand: x forward, dy backward;
  // then the weight), and the step scalar; a site's first eager use calibrates its history.
  // A backward's wgrad in FP8 takes dy^T and x^T (third site: x^T's scaling).
  struct Fp8Operands {
    Fp8Scaling* first = nullptr;
    Fp8Scaling* weight = nullptr;
    Fp8Scaling* input_t = nullptr;
    void* first_fp8 = nullptr;
    void* weight_fp8 = nullptr;
    void* first_t_fp8 = nullptr;  // dy^T
    void* input_t_fp8 = nullptr;  // x^T
    const float* step = nullptr;
  };
  Fp8Operands fp8_operands(std::size_t index, const __nv_bfloat16* first,
                           std::int64_t first_elements, const __nv_bfloat16* w,
                           std::int64_t w_elements, const __nv_bfloat16* input = nullptr,
                           std::int64_t input_elements = 0);
  std::string fp8_op_name(std::size_t index, const char* direction) const;
  // cuBLASLt refused op `index`'s FP8 GEMM at its first use: bf16 from now on, reported.
  void fp8_refused(std::size_t index, const char* direction, int status);
  Status fp8_forward(std::size_t index, __nv_bfloat16* y, __nv_bfloat16* pre,
                     const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                     std::int64_t N, std::int64_t C, std::int64_t OC, bool* done);
  Status fp8_backward(std::size_t index, __nv_bfloat16* dx, const __nv_bfloat16* pre, float* dw,
                      float* dbias, const __nv_bfloat16* dy, const __nv_bfloat16* x,
                      const __nv_bfloat16* w, std::int64_t N, std::int64_t C, std::int64_t OC,
                      bool overwrite_dx, bool* done);
  void write_scalars(const AdamWSettings& settings, std::int64_t step);

  Plan plan_;
  CudaExecutorOptions options_;
  GpuCommunicator* comm_ = nullptr;
  std::byte* arena_ = nullptr;
  // The offloaded optimizer state (plan.memory.host_bytes): pinned host memory mapped into the
  // device's address space, the device's pointer to it, for offsets from arena_bytes on.
  void* host_state_ = nullptr;
  std::byte* host_state_device_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  std::unique_ptr<Matmul> matmul_;
  // cuDNN attention (when chosen): the graphs for the plan's one attention shape, their workspace,
  // and per op whether its attention backward runs through cuDNN (it overwrites dqkv: only where
  // it is dqkv's first writer after the plan's zero; other attention backwards run ours).
  std::unique_ptr<CudnnAttention> cudnn_attention_;
  void* cudnn_workspace_ = nullptr;  // only where a planned workspace is too small
  std::size_t cudnn_workspace_alloc_bytes_ = 0;
  std::vector<void*> cudnn_workspace_of_;  // per attention op: the workspace cuDNN runs in
  std::vector<std::uint8_t> cudnn_backward_;
  AttentionChoice attention_choice_;
  std::size_t first_optimizer_op_ = 0, first_backward_op_ = 0;
  std::vector<std::uint8_t> fused_with_next_;  // crossentropy forward+backward pairs
  // Per op: the classifier_backward of a classifier_forward, else ops.size() (a range holding both
  // skips the forward: the backward writes the losses).
  std::vector<std::size_t> classifier_backward_;
  std::vector<std::uint8_t> skip_zero_, overwrite_;  // overwrite_first_gradient
  // fuse_bias_gradients(): per layernorm_backward, the bias gradient that takes its dx's column
  // sums (kNoTensor: none); per matmul_backward, 1 where that took its bias gradient over.
  std::vector<TensorId> layernorm_dx_sum_;
  std::vector<std::uint8_t> bias_taken_;
  // fuse_gelu: the gelu op run inside a GEMM op's epilogue (per op: its partner's index, or
  // kNoPartner), and the inverse (the gelu op's GEMM op)
  static constexpr std::size_t kNoPartner = static_cast<std::size_t>(-1);
  std::vector<std::size_t> gelu_partner_, gelu_fused_into_;
  void fuse_gelu_pairs();
  std::vector<TensorId> master_of_;  // parameter -> fp32 master copy (or kNoTensor)
  Status build_multi_tensor_tables();
  // Multi-tensor tables on the device (global_norm ops: their gradients; the first adamw op: every
  // adamw op's tensors), all in one allocation made at construction with the norm's partials.
  struct MultiTable {
    const void* entries = nullptr;  // const MultiTensorEntry* on the device
    int count = 0;
    std::int64_t blocks = 0;
  };
  std::vector<MultiTable> op_tables_;
  // Per zero op: its tensors' arena ranges, adjacent ones merged into one memset (the parameter
  // gradients lie in contiguous buckets: one memset per bucket instead of one per gradient).
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> zero_ranges_;
  std::vector<std::uint8_t> adamw_folded_;  // adamw ops run by the first adamw's launch
  std::size_t first_adamw_op_ = 0, last_adamw_op_ = 0;
  void* tables_ = nullptr;
  float* norm_partials_ = nullptr;
  float* skipped_steps_ = nullptr;  // device counter, beside norm_partials_ (optimizer_step_guard)
  // fp8: per op its first cast site (two per GEMM op: x and w forward, dy and w^T backward) or
  // -1, whether it fell back to bf16, per site whether its history was calibrated; the sites'
  // scaling state and the cast operands' buffer (one op's operands at a time), one allocation.
  std::vector<int> fp8_site_;
  std::vector<std::uint8_t> fp8_fallback_, fp8_calibrated_;
  // per op: its FP8-capable GEMMs' choices (forward, or a backward's dx; a backward's dW)
  enum Fp8Chosen : std::uint8_t { kFp8Unmeasured, kFp8Chosen, kBf16Chosen };
  std::vector<std::uint8_t> fp8_chosen_, fp8_dw_chosen_;
  void* fp8_memory_ = nullptr;
  std::size_t fp8_memory_bytes_ = 0, fp8_operand_offset_ = 0, fp8_second_offset_ = 0,
              fp8_first_t_offset_ = 0, fp8_input_t_offset_ = 0;
  Fp8Report fp8_report_;
  std::size_t range_begin_ = 0, range_end_ = 0;  // the range being enqueued
  std::vector<cudaEvent_t> bucket_ready_, bucket_done_;
  std::vector<std::size_t> issued_buckets_;  // issued in the range being enqueued, not yet joined
  // Sharded plans: whose transient gradient buffers the compute stream may reuse only after their
  // reduce-scatter (the plan keeps bucket k's alive until the next bucket's reduce-scatter, where
  // the compute stream waits for it); the gathers' events per all_gather op, and the gathered
  // buffers the compute stream has still to wait for (base tensor -> that gather's done event).
  bool transient_gradients_ = false;
  std::vector<cudaEvent_t> gather_ready_, gather_done_;  // per op (null: not a gather)
  std::map<TensorId, cudaEvent_t> pending_gathers_;
  std::map<TensorId, std::pair<int, std::size_t>> member_of_;  // parameter -> (bucket, member)
  Status enqueue_collective(std::size_t index, const Op& op, bool communicate);

  // Pinned staging of the host -> device copies made before each launch (two slots, so the host
  // fills one while the previous copy may still be in flight).
  struct Staging {
    std::int32_t* tokens = nullptr;  // B*T tokens then B*T targets
    float* scalars = nullptr;        // kNumScalars
    cudaEvent_t copied = nullptr;
  };
  Staging staging_[2];
  int staging_slot_ = 0;
  bool batch_pending_ = false;
  float host_scalars_[kNumScalars] = {};
  std::vector<std::int32_t> pending_batch_;

  // (begin, end, communicate) -> instantiated graph; ranges run eagerly once before capture (the
  // first call also warms cuBLASLt's algorithm cache and the kernels' attributes).
  using RangeKey = std::tuple<std::size_t, std::size_t, bool, bool>;  // begin, end, comm, traced
  std::map<RangeKey, cudaGraphExec_t> graphs_;
  std::map<RangeKey, int> eager_runs_;
  std::size_t graph_nodes_ = 0;
  double last_launch_host_ms_ = 0;
  std::vector<cudaEvent_t> op_start_, op_end_;  // profile_ops
  std::vector<std::uint8_t> op_recorded_;
  // Tracing: events per op and per bucket, recorded in the traced graphs; the base on the stream.
  bool tracing_ = false;
  bool capturing_ = false;  // the range being enqueued is being captured
  cudaEvent_t trace_base_ = nullptr;
  std::vector<cudaEvent_t> trace_start_, trace_end_, trace_bucket_start_, trace_bucket_end_;
  std::vector<std::uint8_t> trace_recorded_, trace_bucket_recorded_;
  // The ops and buckets whose events each traced graph records (a replay records them again
  // without enqueue_range running), and those of the range being enqueued.
  std::map<RangeKey, std::pair<std::vector<std::size_t>, std::vector<std::size_t>>> traced_in_;
  std::vector<std::size_t> range_traced_ops_, range_traced_buckets_;
  cudaError_t record_trace_event(cudaEvent_t event, cudaStream_t stream) const;
};

}  // namespace topolaunch::kernels::cuda
