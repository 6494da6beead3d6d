// The static training graph: tensors (shape, dtype, role) and ops in execution order (a DAG whose
// order is already a valid schedule). Builders make the forward graph of a GPT-2-family model, a
// LLaMA-family model or an MLP; autodiff appends the backward from per-op gradient rules; the
// optimizer (global-norm clipping + AdamW) is appended as ops too, so one op list is the whole
// training step and every backend (CPU now, CUDA later) executes the same list over the same arena
// offsets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/result.hpp"

namespace topolaunch::kernels {

enum class DType : std::uint8_t { f32, f64, bf16, i32 };
std::size_t dtype_bytes(DType dtype);
std::string_view dtype_name(DType dtype);

// Role decides where a tensor lives in the arena: parameters, gradients and optimizer state are
// persistent (whole-step lifetime); activations, inputs and workspace are planned by liveness.
enum class Role : std::uint8_t {
  parameter,
  gradient,
  optimizer_state,
  activation,
  input,
  workspace
};
std::string_view role_name(Role role);

using TensorId = std::int32_t;
inline constexpr TensorId kNoTensor = -1;

struct Tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::f32;
  Role role = Role::activation;
  bool decayed = false;  // parameters: AdamW weight decay applies (matrices only)
  // Parameters: the initial values every backend draws (the same values from the same seed):
  // N(0, init_std) when init_std > 0, else all init_value (norm weights 1, biases 0).
  double init_std = 0, init_value = 0;
  TensorId grad = kNoTensor;  // parameter or activation -> its gradient, once autodiff ran
  // A view holds no memory of its own: its elements are elements [view_offset, view_offset +
  // elements()) of `view_of` (same dtype). Data-parallel plans make each parameter and gradient a
  // view of its communication bucket's flat buffer (plan.hpp).
  TensorId view_of = kNoTensor;
  std::int64_t view_offset = 0;

  std::int64_t elements() const;
  std::size_t bytes() const { return static_cast<std::size_t>(elements()) * dtype_bytes(dtype); }
};

// Operand conventions (inputs -> outputs); N = rows (B*T), C = channels. Backward ops ACCUMULATE
// (+=) into their gradient outputs (llm.c convention, needed for tied weights and residual
// fan-out); autodiff inserts a `zero` before each gradient's first contribution. Exceptions that
// overwrite: crossentropy_backward (dlogits may alias logits in place).
enum class OpKind : std::uint8_t {
  encoder_forward,             // {tokens(B,T) i32, wte(V,C), [wpe(maxT,C)]} -> {x(B,T,C)}
  encoder_backward,            // {dx, tokens} -> {dwte, [dwpe]}
  layernorm_forward,           // {x(N,C), w(C), b(C)} -> {y(N,C), mean(N), rstd(N)}
  layernorm_backward,          // {dy, x, w, mean, rstd} -> {dx, dw, db}
  residual_layernorm_forward,  // fused: {a, b, w, bias} -> {s=a+b, y=ln(s), mean, rstd}
  matmul_forward,              // {x(N,C), w(OC,C), [bias(OC)]} -> {y(N,OC)}
  matmul_backward,             // {dy, x, w} -> {dx, dw, [dbias]}
  attention_forward,           // causal, not materialised: {qkv(B,T,C+2KC)} -> {y(B,T,C),
                               // lse(B,NH,T)}; KC = C/NH*NKV (grouped-query: KC < C)
  attention_backward,          // {dy, qkv, y, lse} -> {dqkv}
  rmsnorm_forward,             // {x(N,C), w(C)} -> {y(N,C), rstd(N)}
  rmsnorm_backward,            // {dy, x, w, rstd} -> {dx, dw}
  residual_rmsnorm_forward,    // fused: {a, b, w} -> {s=a+b, y=rmsnorm(s), rstd}
  rope_forward,                // rotary positions on q and k: {qkv(B,T,C+2KC)} -> {qkv'} (v copied)
  rope_backward,               // {dqkv'} -> {dqkv}
  swiglu_forward,              // {gu(N,2H)} -> {h(N,H) = silu(g) * u}, g|u the two halves of a row
  swiglu_backward,             // {dh, gu} -> {dgu}
  gelu_forward,                // tanh approximation: {x} -> {y}
  gelu_backward,               // {dy, x} -> {dx}
  residual_forward,            // {a, b} -> {y = a + b}
  residual_backward,           // {dy} -> {da, db}
  crossentropy_forward,   // softmax + CE over the first `vocab` of Vp: {logits(B,T,Vp), targets} ->
                          // {losses(B,T)}
  crossentropy_backward,  // {logits, targets, scalars} -> {dlogits} (overwrites; scale =
                          // scalars[loss_scale])
  zero,                   // {} -> {t...}
  global_norm,            // {grads...} -> {norm(1)}; each grad in `segments` equal parts, the
                          // squares summed part by part (data parallel: as sharded plans do)
  adamw,                  // {grad, norm, scalars} -> {param, m, v}
  all_reduce,             // sum over ranks, in place: {bucket's gradient buffer} -> {same}
  // Sharded data parallelism (plan.hpp, ShardMode): `bucket` names the bucket, whose flat buffer
  // is cut into one segment per rank; this rank's segment is its shard.
  reduce_scatter,       // {grad buffer} -> {grad buffer[, grad shard]}: this rank's segment of the
                        // buffer summed over ranks (and added into the grad shard)
  all_gather,           // {param shard} -> {param buffer}: every rank's segment to every rank
  sharded_global_norm,  // {each bucket's grad shard} -> {norm}: partial sums gathered over ranks
  sharded_adamw,        // {grad shard, norm, scalars} -> {param shard, m, v[, master]}: AdamW of
                        // the bucket members' elements within this rank's segment
  // The output head and its loss in row chunks (plan.hpp, chunk_classifier): the logits of
  // `chunk_rows` rows at a time in the op's workspace, never the whole (N, Vp).
  classifier_forward,   // {x(N,C), w(Vp,C), targets} -> {losses(N)}: per chunk x w^T, then CE
  classifier_backward,  // {x, w, targets, scalars} -> {dx, dw, losses}: per chunk the logits
                        // again, CE forward + backward in place, dx (+)= dl w, dw += dl^T x; it
                        // writes the losses too, so a step that runs it skips classifier_forward
};
std::string_view op_name(OpKind kind);

enum class Phase : std::uint8_t { forward, backward, recompute, optimizer, communication };
std::string_view phase_name(Phase phase);

struct Op {
  OpKind kind = OpKind::zero;
  Phase phase = Phase::forward;
  std::string name = {};
  std::vector<TensorId> inputs = {};
  std::vector<TensorId> outputs = {};
  std::int64_t num_heads = 0;     // attention, rope: query heads
  std::int64_t num_kv_heads = 0;  // attention, rope: key/value heads (0: num_heads)
  double rope_theta = 0;          // rope: base of the rotation frequencies
  std::int64_t vocab = 0;         // crossentropy, classifier: real vocabulary (logits padded to Vp)
  std::int64_t chunk_rows = 0;    // classifier: rows of logits per chunk (its workspace's rows)
  int bucket = -1;                // all_reduce and the sharded ops: communication bucket index
  int segments = 1;               // global_norm: parts per input (data parallel: the ranks)
  TensorId workspace = kNoTensor;  // scratch live only during this op (attention score rows)
  // Tensors this op keeps live without touching them: a ZeRO-2/3 reduce-scatter keeps the
  // previous bucket's transient gradient buffer, which a backend's side stream may still be
  // reducing (the CUDA executor waits for that reduction here).
  std::vector<TensorId> keep_alive = {};
};

// The shape an attention (or rope) op works on: qkv is (B, T, C + 2*KC), KC = C / NH * NKV.
struct AttentionShape {
  std::int64_t B = 0, T = 0, C = 0, NH = 0, NKV = 0;
  std::int64_t head_size() const { return C / NH; }
  std::int64_t kv_channels() const { return C / NH * NKV; }
  std::int64_t qkv_channels() const { return C + 2 * kv_channels(); }
};
struct Graph;
// `qkv` is the op's (B, T, C+2KC) operand: attention_forward's and rope's input,
// attention_backward's second input, rope_backward's gradient.
AttentionShape attention_shape(const Graph& graph, const Op& op, TensorId qkv);

// Per-step scalars live in the arena (a CUDA Graph replays pointers, not values).
enum ScalarSlot : int {
  kLearningRate = 0,
  kBeta1,
  kBeta2,
  kEpsilon,
  kWeightDecay,
  kStep,       // AdamW step t (1-based) for bias correction
  kGradClip,   // max global norm; <= 0 disables clipping
  kLossScale,  // d(loss)/d(per-token loss): 1 / (tokens per optimizer step over all ranks)
  kNumScalars
};

struct Precision {
  DType param = DType::f32;       // parameters (and their gradients unless fp32_statistics)
  DType activation = DType::f32;  // activations and activation gradients
  DType optimizer = DType::f32;   // AdamW m, v (and the master copy when param is not fp32)
  // Mixed precision as the CUDA kernels take it (kernels/cuda/kernel_primitives.cuh): parameter
  // gradients, LayerNorm mean/rstd, attention log-sum-exp and scratch, and the per-token losses
  // are fp32 while parameters and activations stay in their (bf16) types. Off: all of these take
  // the param/activation type (the fp32 and f64 CPU graphs).
  bool fp32_statistics = false;

  // The CUDA backend's graph: bf16 working parameters and activations, fp32 everything else.
  static Precision cuda_bf16() { return {DType::bf16, DType::bf16, DType::f32, true}; }
  DType statistics() const { return fp32_statistics ? DType::f32 : activation; }
  DType gradient() const { return fp32_statistics ? DType::f32 : param; }
};

struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  std::vector<TensorId> params;  // in creation order
  TensorId tokens = kNoTensor;   // (B,T) i32 input
  TensorId targets = kNoTensor;  // (B,T) i32 input
  TensorId losses = kNoTensor;   // (B,T) per-token loss
  TensorId scalars = kNoTensor;  // kNumScalars
  TensorId grad_norm = kNoTensor;
  std::int64_t batch = 0, seq_len = 0, vocab = 0;
  Precision precision;

  TensorId add_tensor(std::string name, std::vector<std::int64_t> shape, DType dtype, Role role);
  // A view of `base` (its dtype) at element `offset` (see Tensor::view_of).
  TensorId add_view(std::string name, TensorId base, std::int64_t offset,
                    std::vector<std::int64_t> shape, Role role);
  void add_op(Op op) { ops.push_back(std::move(op)); }
  const Tensor& operator[](TensorId id) const { return tensors[static_cast<std::size_t>(id)]; }
  Tensor& operator[](TensorId id) { return tensors[static_cast<std::size_t>(id)]; }
  std::size_t parameter_count() const;  // elements
};

struct GptConfig {
  std::int64_t n_layer = 2, n_embd = 64, n_head = 4;
  std::int64_t block_size = 64;  // max context (wpe rows)
  std::int64_t vocab_size = 65;
  std::int64_t padded_vocab = 0;  // 0: round vocab up to a multiple of 64 (llm.c pads to 128*k)
  std::int64_t batch = 4, seq_len = 64;
};

// A LLaMA-style decoder: RMSNorm (pre-norm), rotary position embeddings, grouped-query attention
// (n_kv_head key/value heads shared by n_head / n_kv_head query heads each), a SwiGLU MLP of width
// ffn_hidden, an untied output head, no biases.
struct LlamaConfig {
  std::int64_t n_layer = 2, n_embd = 64, n_head = 4, n_kv_head = 2;
  std::int64_t ffn_hidden = 0;  // 0: 8/3 n_embd rounded up to a multiple of 64 (LLaMA's 2/3 of 4C)
  double rope_theta = 10000.0;
  std::int64_t vocab_size = 65;
  std::int64_t padded_vocab = 0;  // 0: round vocab up to a multiple of 64
  std::int64_t batch = 4, seq_len = 64;
};
// LLaMA's default MLP width for n_embd (LlamaConfig::ffn_hidden = 0).
std::int64_t llama_default_ffn_hidden(std::int64_t n_embd);

// A bigram-style MLP over tokens: embedding -> [matmul + gelu]* -> matmul to vocab -> CE.
struct MlpConfig {
  std::int64_t vocab_size = 65, n_embd = 32;
  std::vector<std::int64_t> hidden = {64};
  std::int64_t batch = 4, seq_len = 16;
};

// The configs are taken as valid: a job file's [model] and [train] are checked where they are
// read (jobspec: positive sizes, n_embd a multiple of n_head, seq_len within block_size; llama:
// n_head a multiple of n_kv_head, an even head size).
Graph build_gpt2(const GptConfig& config, const Precision& precision = {});
Graph build_llama(const LlamaConfig& config, const Precision& precision = {});
Graph build_mlp(const MlpConfig& config, const Precision& precision = {});

// Appends the backward graph (seeded by crossentropy_backward with scalars[kLossScale]) and gives
// every parameter a gradient tensor (Role::gradient).
void append_backward(Graph& graph);
// Appends global_norm (when clipping is wanted it reads scalars[kGradClip] at run time) and one
// adamw op per parameter; m and v (and a master copy when params are not fp32) are optimizer state.
void append_optimizer(Graph& graph);

// The classifier_backward that follows the classifier_forward at ops[forward] (same w and targets;
// its x is the forward's or a recomputed copy), or ops.size() when there is none.
std::size_t classifier_backward_of(const Graph& graph, std::size_t forward);

// Floating-point work of one op (multiply-add = 2), the cost model of rematerialisation.
// classifier_backward counts its dx and dw GEMMs and the CE backward only: the logits it computes
// again are classifier_forward's work, which a training step skips (so a step's sum is the model's
// 6 N C Vp for the head, as before chunking).
double op_flops(const Graph& graph, const Op& op);

}  // namespace topolaunch::kernels
