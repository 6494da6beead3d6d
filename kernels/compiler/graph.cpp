// Graph IR basics, the GPT-2 / LLaMA / MLP builders, autodiff from per-op gradient rules, the
// optimizer ops.
#include "topolaunch/kernels/graph.hpp"

#include <cmath>
#include <map>
#include <stdexcept>

namespace topolaunch::kernels {

std::size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
  }
  return "?";
}

std::string_view role_name(Role role) {
  switch (role) {
    case Role::parameter:
      return "parameter";
    case Role::gradient:
      return "gradient";
    case Role::optimizer_state:
      return "optimizer";
    case Role::activation:
      return "activation";
    case Role::input:
      return "input";
    case Role::workspace:
      return "workspace";
  }
  return "?";
}

std::string_view op_name(OpKind kind) {
  switch (kind) {
    case OpKind::encoder_forward:
      return "encoder_forward";
    case OpKind::encoder_backward:
      return "encoder_backward";
    case OpKind::layernorm_forward:
      return "layernorm_forward";
    case OpKind::layernorm_backward:
      return "layernorm_backward";
    case OpKind::residual_layernorm_forward:
      return "residual_layernorm_forward";
    case OpKind::matmul_forward:
      return "matmul_forward";
    case OpKind::matmul_backward:
      return "matmul_backward";
    case OpKind::attention_forward:
      return "attention_forward";
    case OpKind::attention_backward:
      return "attention_backward";
    case OpKind::rmsnorm_forward:
      return "rmsnorm_forward";
    case OpKind::rmsnorm_backward:
      return "rmsnorm_backward";
    case OpKind::residual_rmsnorm_forward:
      return "residual_rmsnorm_forward";
    case OpKind::rope_forward:
      return "rope_forward";
    case OpKind::rope_backward:
      return "rope_backward";
    case OpKind::swiglu_forward:
      return "swiglu_forward";
    case OpKind::swiglu_backward:
      return "swiglu_backward";
    case OpKind::gelu_forward:
      return "gelu_forward";
    case OpKind::gelu_backward:
      return "gelu_backward";
    case OpKind::residual_forward:
      return "residual_forward";
    case OpKind::residual_backward:
      return "residual_backward";
    case OpKind::crossentropy_forward:
      return "crossentropy_forward";
    case OpKind::crossentropy_backward:
      return "crossentropy_backward";
    case OpKind::zero:
      return "zero";
    case OpKind::global_norm:
      return "global_norm";
    case OpKind::adamw:
      return "adamw";
    case OpKind::all_reduce:
      return "all_reduce";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::all_gather:
      return "all_gather";
    case OpKind::sharded_global_norm:
      return "sharded_global_norm";
    case OpKind::sharded_adamw:
      return "sharded_adamw";
    case OpKind::classifier_forward:
      return "classifier_forward";
    case OpKind::classifier_backward:
      return "classifier_backward";
  }
  return "?";
}

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::recompute:
      return "recompute";
    case Phase::optimizer:
      return "optimizer";
    case Phase::communication:
      return "communication";
  }
  return "?";
}

std::int64_t Tensor::elements() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

TensorId Graph::add_tensor(std::string name, std::vector<std::int64_t> shape, DType dtype,
                           Role role) {
  Tensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.role = role;
  tensors.push_back(std::move(t));
  return static_cast<TensorId>(tensors.size() - 1);
}

AttentionShape attention_shape(const Graph& g, const Op& op, TensorId qkv) {
  AttentionShape a;
  const auto& s = g[qkv].shape;  // (B, T, C + 2KC)
  a.B = s[0];
  a.T = s[1];
  a.NH = op.num_heads;
  a.NKV = op.num_kv_heads > 0 ? op.num_kv_heads : op.num_heads;
  a.C = s[2] * a.NH / (a.NH + 2 * a.NKV);
  return a;
}

std::int64_t llama_default_ffn_hidden(std::int64_t n_embd) {
  return (8 * n_embd / 3 + 63) / 64 * 64;
}

TensorId Graph::add_view(std::string name, TensorId base, std::int64_t offset,
                         std::vector<std::int64_t> shape, Role role) {
  const DType dtype = (*this)[base].dtype;
  TensorId v = add_tensor(std::move(name), std::move(shape), dtype, role);
  (*this)[v].view_of = base;
  (*this)[v].view_offset = offset;
  return v;
}

std::size_t Graph::parameter_count() const {
  std::size_t n = 0;
  for (auto p : params) n += static_cast<std::size_t>((*this)[p].elements());
  return n;
}

namespace {

struct Builder {
  Graph& g;
  // Matrices (decayed) are drawn N(0, init_std); vectors are constant: norm weights 1, biases 0.
  TensorId param(const std::string& name, std::vector<std::int64_t> shape, bool decayed,
                 double init_std = 0.02, double init_value = 0) {
    TensorId id = g.add_tensor(name, std::move(shape), g.precision.param, Role::parameter);
    g[id].decayed = decayed;
    g[id].init_std = decayed ? init_std : 0;
    g[id].init_value = init_value;
    g.params.push_back(id);
    return id;
  }
  TensorId norm_weight(const std::string& name, std::int64_t C) {
    return param(name, {C}, false, 0, 1);
  }
  TensorId act(const std::string& name, std::vector<std::int64_t> shape) {
    return g.add_tensor(name, std::move(shape), g.precision.activation, Role::activation);
  }
  // LayerNorm mean/rstd, attention log-sum-exp, per-token losses.
  TensorId stat(const std::string& name, std::vector<std::int64_t> shape) {
    return g.add_tensor(name, std::move(shape), g.precision.statistics(), Role::activation);
  }
  void op(OpKind kind, const std::string& name, std::vector<TensorId> in,
          std::vector<TensorId> out) {
    Op o{kind};
    o.name = name;
    o.inputs = std::move(in);
    o.outputs = std::move(out);
    g.add_op(std::move(o));
  }
  void inputs_and_scalars(std::int64_t B, std::int64_t T) {
    g.tokens = g.add_tensor("tokens", {B, T}, DType::i32, Role::input);
    g.targets = g.add_tensor("targets", {B, T}, DType::i32, Role::input);
    g.scalars = g.add_tensor("scalars", {kNumScalars}, g.precision.optimizer, Role::input);
  }
  void classifier(TensorId logits, std::int64_t B, std::int64_t T, std::int64_t V) {
    g.losses = stat("losses", {B, T});
    Op o{OpKind::crossentropy_forward};
    o.name = "crossentropy";
    o.inputs = {logits, g.targets};
    o.outputs = {g.losses};
    o.vocab = V;
    g.add_op(std::move(o));
  }
};

}  // namespace

Graph build_gpt2(const GptConfig& c, const Precision& precision) {
  Graph g;
  g.precision = precision;
  Builder b{g};
  const std::int64_t B = c.batch, T = c.seq_len, C = c.n_embd, L = c.n_layer;
  const std::int64_t Vp = c.padded_vocab ? c.padded_vocab : (c.vocab_size + 63) / 64 * 64;
  g.batch = B;
  g.seq_len = T;
  g.vocab = c.vocab_size;
  b.inputs_and_scalars(B, T);
  TensorId wte = b.param("wte", {Vp, C}, true);
  TensorId wpe = b.param("wpe", {c.block_size, C}, true);
  TensorId x = b.act("encoded", {B, T, C});
  b.op(OpKind::encoder_forward, "encoder", {g.tokens, wte, wpe}, {x});
  // GPT-2's init: matrices N(0, 0.02), the residual projections 0.02 / sqrt(2L).
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    TensorId ln1w = b.norm_weight(p + "ln1w", C), ln1b = b.param(p + "ln1b", {C}, false);
    TensorId qkvw = b.param(p + "qkvw", {3 * C, C}, true),
             qkvb = b.param(p + "qkvb", {3 * C}, false);
    TensorId attprojw = b.param(p + "attprojw", {C, C}, true, proj_std),
             attprojb = b.param(p + "attprojb", {C}, false);
    TensorId ln2w = b.norm_weight(p + "ln2w", C), ln2b = b.param(p + "ln2b", {C}, false);
    TensorId fcw = b.param(p + "fcw", {4 * C, C}, true), fcb = b.param(p + "fcb", {4 * C}, false);
    TensorId fcprojw = b.param(p + "fcprojw", {C, 4 * C}, true, proj_std),
             fcprojb = b.param(p + "fcprojb", {C}, false);

    TensorId ln1 = b.act(p + "ln1", {B, T, C}), ln1m = b.stat(p + "ln1_mean", {B * T}),
             ln1r = b.stat(p + "ln1_rstd", {B * T});
    b.op(OpKind::layernorm_forward, p + "ln1", {x, ln1w, ln1b}, {ln1, ln1m, ln1r});
    TensorId qkv = b.act(p + "qkv", {B, T, 3 * C});
    b.op(OpKind::matmul_forward, p + "qkv", {ln1, qkvw, qkvb}, {qkv});
    TensorId atty = b.act(p + "atty", {B, T, C}), lse = b.stat(p + "att_lse", {B, c.n_head, T});
    Op att{OpKind::attention_forward};
    att.name = p + "attention";
    att.inputs = {qkv};
    att.outputs = {atty, lse};
    att.num_heads = c.n_head;
    att.workspace = g.add_tensor(p + "att_scratch", {B * c.n_head, T}, g.precision.statistics(),
                                 Role::workspace);
    g.add_op(std::move(att));
    TensorId attproj = b.act(p + "attproj", {B, T, C});
    b.op(OpKind::matmul_forward, p + "attproj", {atty, attprojw, attprojb}, {attproj});
    TensorId res2 = b.act(p + "residual2", {B, T, C});
    b.op(OpKind::residual_forward, p + "residual2", {x, attproj}, {res2});
    TensorId ln2 = b.act(p + "ln2", {B, T, C}), ln2m = b.stat(p + "ln2_mean", {B * T}),
             ln2r = b.stat(p + "ln2_rstd", {B * T});
    b.op(OpKind::layernorm_forward, p + "ln2", {res2, ln2w, ln2b}, {ln2, ln2m, ln2r});
    TensorId fch = b.act(p + "fch", {B, T, 4 * C});
    b.op(OpKind::matmul_forward, p + "fc", {ln2, fcw, fcb}, {fch});
    TensorId fchg = b.act(p + "fch_gelu", {B, T, 4 * C});
    b.op(OpKind::gelu_forward, p + "gelu", {fch}, {fchg});
    TensorId fcproj = b.act(p + "fcproj", {B, T, C});
    b.op(OpKind::matmul_forward, p + "fcproj", {fchg, fcprojw, fcprojb}, {fcproj});
    TensorId res3 = b.act(p + "residual3", {B, T, C});
    b.op(OpKind::residual_forward, p + "residual3", {res2, fcproj}, {res3});
    x = res3;
  }
  TensorId lnfw = b.norm_weight("lnfw", C), lnfb = b.param("lnfb", {C}, false);
  TensorId lnf = b.act("lnf", {B, T, C}), lnfm = b.stat("lnf_mean", {B * T}),
           lnfr = b.stat("lnf_rstd", {B * T});
  b.op(OpKind::layernorm_forward, "lnf", {x, lnfw, lnfb}, {lnf, lnfm, lnfr});
  TensorId logits = b.act("logits", {B, T, Vp});
  b.op(OpKind::matmul_forward, "lm_head", {lnf, wte}, {logits});  // tied: the head reuses wte
  b.classifier(logits, B, T, c.vocab_size);
  return g;
}

Graph build_llama(const LlamaConfig& c, const Precision& precision) {
  Graph g;
  g.precision = precision;
  Builder b{g};
  const std::int64_t B = c.batch, T = c.seq_len, C = c.n_embd, L = c.n_layer;
  const std::int64_t KC = C / c.n_head * c.n_kv_head;  // key (and value) channels
  const std::int64_t H = c.ffn_hidden > 0 ? c.ffn_hidden : llama_default_ffn_hidden(C);
  const std::int64_t Vp = c.padded_vocab ? c.padded_vocab : (c.vocab_size + 63) / 64 * 64;
  g.batch = B;
  g.seq_len = T;
  g.vocab = c.vocab_size;
  b.inputs_and_scalars(B, T);
  TensorId wte = b.param("wte", {Vp, C}, true);
  TensorId x = b.act("encoded", {B, T, C});
  b.op(OpKind::encoder_forward, "encoder", {g.tokens, wte}, {x});  // no learned positions
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
  auto rmsnorm = [&](const std::string& name, TensorId in, TensorId w) {
    TensorId y = b.act(name, {B, T, C}), rstd = b.stat(name + "_rstd", {B * T});
    b.op(OpKind::rmsnorm_forward, name, {in, w}, {y, rstd});
    return y;
  };
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    TensorId norm1w = b.norm_weight(p + "norm1w", C);
    // One GEMM for q, k and v (the rows of wq, wk, wv stacked): qkv is (B,T,C+2KC).
    TensorId qkvw = b.param(p + "qkvw", {C + 2 * KC, C}, true);
    TensorId attprojw = b.param(p + "attprojw", {C, C}, true, proj_std);
    TensorId norm2w = b.norm_weight(p + "norm2w", C);
    // One GEMM for the gate and up projections (w1 and w3 stacked): (B,T,2H).
    TensorId fcw = b.param(p + "fcw", {2 * H, C}, true);
    TensorId fcprojw = b.param(p + "fcprojw", {C, H}, true, proj_std);

    TensorId n1 = rmsnorm(p + "norm1", x, norm1w);
    TensorId qkv = b.act(p + "qkv", {B, T, C + 2 * KC});
    b.op(OpKind::matmul_forward, p + "qkv", {n1, qkvw}, {qkv});
    TensorId qkvr = b.act(p + "qkv_rope", {B, T, C + 2 * KC});
    Op rope{OpKind::rope_forward};
    rope.name = p + "rope";
    rope.inputs = {qkv};
    rope.outputs = {qkvr};
    rope.num_heads = c.n_head;
    rope.num_kv_heads = c.n_kv_head;
    rope.rope_theta = c.rope_theta;
    g.add_op(std::move(rope));
    TensorId atty = b.act(p + "atty", {B, T, C}), lse = b.stat(p + "att_lse", {B, c.n_head, T});
    Op att{OpKind::attention_forward};
    att.name = p + "attention";
    att.inputs = {qkvr};
    att.outputs = {atty, lse};
    att.num_heads = c.n_head;
    att.num_kv_heads = c.n_kv_head;
    att.workspace = g.add_tensor(p + "att_scratch", {B * c.n_head, T}, g.precision.statistics(),
                                 Role::workspace);
    g.add_op(std::move(att));
    TensorId attproj = b.act(p + "attproj", {B, T, C});
    b.op(OpKind::matmul_forward, p + "attproj", {atty, attprojw}, {attproj});
    TensorId res2 = b.act(p + "residual2", {B, T, C});
    b.op(OpKind::residual_forward, p + "residual2", {x, attproj}, {res2});
    TensorId n2 = rmsnorm(p + "norm2", res2, norm2w);
    TensorId fch = b.act(p + "fch", {B, T, 2 * H});
    b.op(OpKind::matmul_forward, p + "fc", {n2, fcw}, {fch});
    TensorId fchs = b.act(p + "fch_swiglu", {B, T, H});
    b.op(OpKind::swiglu_forward, p + "swiglu", {fch}, {fchs});
    TensorId fcproj = b.act(p + "fcproj", {B, T, C});
    b.op(OpKind::matmul_forward, p + "fcproj", {fchs, fcprojw}, {fcproj});
    TensorId res3 = b.act(p + "residual3", {B, T, C});
    b.op(OpKind::residual_forward, p + "residual3", {res2, fcproj}, {res3});
    x = res3;
  }
  TensorId normfw = b.norm_weight("normfw", C);
  TensorId lm_headw = b.param("lm_headw", {Vp, C}, true);  // untied from wte
  TensorId nf = rmsnorm("normf", x, normfw);
  TensorId logits = b.act("logits", {B, T, Vp});
  b.op(OpKind::matmul_forward, "lm_head", {nf, lm_headw}, {logits});
  b.classifier(logits, B, T, c.vocab_size);
  return g;
}

Graph build_mlp(const MlpConfig& c, const Precision& precision) {
  Graph g;
  g.precision = precision;
  Builder b{g};
  const std::int64_t B = c.batch, T = c.seq_len;
  const std::int64_t Vp = (c.vocab_size + 63) / 64 * 64;
  g.batch = B;
  g.seq_len = T;
  g.vocab = c.vocab_size;
  b.inputs_and_scalars(B, T);
  TensorId wte = b.param("wte", {c.vocab_size, c.n_embd}, true);
  TensorId x = b.act("embedded", {B, T, c.n_embd});
  b.op(OpKind::encoder_forward, "embedding", {g.tokens, wte}, {x});
  std::int64_t width = c.n_embd;
  for (std::size_t i = 0; i < c.hidden.size(); ++i) {
    const std::string p = "fc" + std::to_string(i);
    TensorId w = b.param(p + ".w", {c.hidden[i], width}, true),
             bias = b.param(p + ".b", {c.hidden[i]}, false);
    TensorId h = b.act(p, {B, T, c.hidden[i]});
    b.op(OpKind::matmul_forward, p, {x, w, bias}, {h});
    TensorId a = b.act(p + "_gelu", {B, T, c.hidden[i]});
    b.op(OpKind::gelu_forward, p + ".gelu", {h}, {a});
    x = a;
    width = c.hidden[i];
  }
  TensorId w = b.param("head.w", {Vp, width}, true), bias = b.param("head.b", {Vp}, false);
  TensorId logits = b.act("logits", {B, T, Vp});
  b.op(OpKind::matmul_forward, "head", {x, w, bias}, {logits});
  b.classifier(logits, B, T, c.vocab_size);
  return g;
}

namespace {

// Autodiff state: the gradient tensor of each forward tensor, created on first contribution.
struct Autodiff {
  Graph& g;
  std::vector<Op> pending;  // zero ops that must precede the op being emitted

  TensorId grad_of(TensorId t) {
    Tensor& tensor = g[t];
    if (tensor.grad != kNoTensor) return tensor.grad;
    const bool is_param = tensor.role == Role::parameter;
    TensorId d = g.add_tensor("d" + tensor.name, tensor.shape,
                              is_param ? g.precision.gradient() : tensor.dtype,
                              is_param ? Role::gradient : Role::activation);
    g[t].grad = d;
    // Parameter gradients are zero at step start (the optimizer re-zeroes them); activation
    // gradients are zeroed just before their first (accumulating) contribution.
    if (!is_param) {
      Op z{OpKind::zero, Phase::backward, "zero d" + g[t].name, {}, {d}};
      pending.push_back(std::move(z));
    }
    return d;
  }
  void emit(Op op) {
    op.phase = Phase::backward;
    for (auto& z : pending) g.add_op(std::move(z));
    pending.clear();
    g.add_op(std::move(op));
  }
};

}  // namespace

void append_backward(Graph& g) {
  Autodiff ad{g, {}};
  const std::size_t n_forward = g.ops.size();
  std::vector<int> readers(g.tensors.size(), 0);  // forward ops reading each tensor
  for (std::size_t i = 0; i < n_forward; ++i)
    if (g.ops[i].phase == Phase::forward)
      for (auto t : g.ops[i].inputs) ++readers[static_cast<std::size_t>(t)];
  for (std::size_t i = n_forward; i-- > 0;) {
    const Op f = g.ops[i];  // copy: emitting appends to g.ops
    if (f.phase != Phase::forward) continue;
    auto has_grad = [&](TensorId t) { return g[t].grad != kNoTensor; };
    Op b{OpKind::zero};
    b.name = f.name;
    switch (f.kind) {
      case OpKind::crossentropy_forward: {
        TensorId logits = f.inputs[0];
        TensorId dlogits =
            g.add_tensor("d" + g[logits].name, g[logits].shape, g[logits].dtype, Role::activation);
        g[logits].grad = dlogits;
        b.kind = OpKind::crossentropy_backward;
        b.inputs = {logits, f.inputs[1], g.scalars};
        b.outputs = {dlogits};
        b.vocab = f.vocab;
        break;
      }
      case OpKind::encoder_forward: {
        if (!has_grad(f.outputs[0])) continue;
        b.kind = OpKind::encoder_backward;
        b.inputs = {g[f.outputs[0]].grad, f.inputs[0]};
        for (std::size_t k = 1; k < f.inputs.size(); ++k)
          b.outputs.push_back(ad.grad_of(f.inputs[k]));
        break;
      }
      case OpKind::layernorm_forward: {
        if (!has_grad(f.outputs[0])) continue;
        b.kind = OpKind::layernorm_backward;
        b.inputs = {g[f.outputs[0]].grad, f.inputs[0], f.inputs[1], f.outputs[1], f.outputs[2]};
        b.outputs = {ad.grad_of(f.inputs[0]), ad.grad_of(f.inputs[1]), ad.grad_of(f.inputs[2])};
        break;
      }
      case OpKind::matmul_forward: {
        if (!has_grad(f.outputs[0])) continue;
        b.kind = OpKind::matmul_backward;
        b.inputs = {g[f.outputs[0]].grad, f.inputs[0], f.inputs[1]};
        b.outputs = {ad.grad_of(f.inputs[0]), ad.grad_of(f.inputs[1])};
        if (f.inputs.size() > 2) b.outputs.push_back(ad.grad_of(f.inputs[2]));
        break;
      }
      case OpKind::attention_forward: {
        if (!has_grad(f.outputs[0])) continue;
        b.kind = OpKind::attention_backward;
        b.inputs = {g[f.outputs[0]].grad, f.inputs[0], f.outputs[0], f.outputs[1]};
        b.outputs = {ad.grad_of(f.inputs[0])};
        b.num_heads = f.num_heads;
        b.num_kv_heads = f.num_kv_heads;
        b.workspace = g.add_tensor(f.name + ".bwd_scratch", g[f.workspace].shape,
                                   g[f.workspace].dtype, Role::workspace);
        break;
      }
      case OpKind::rmsnorm_forward: {
        if (!has_grad(f.outputs[0])) continue;
        b.kind = OpKind::rmsnorm_backward;
        b.inputs = {g[f.outputs[0]].grad, f.inputs[0], f.inputs[1], f.outputs[1]};
        b.outputs = {ad.grad_of(f.inputs[0]), ad.grad_of(f.inputs[1])};
        break;
      }
      case OpKind::rope_forward: {
        if (!has_grad(f.outputs[0])) continue;
        b.kind = OpKind::rope_backward;
        b.inputs = {g[f.outputs[0]].grad};
        b.outputs = {ad.grad_of(f.inputs[0])};
        b.num_heads = f.num_heads;
        b.num_kv_heads = f.num_kv_heads;
        b.rope_theta = f.rope_theta;
        break;
      }
      case OpKind::swiglu_forward: {
        if (!has_grad(f.outputs[0])) continue;
        b.kind = OpKind::swiglu_backward;
        b.inputs = {g[f.outputs[0]].grad, f.inputs[0]};
        b.outputs = {ad.grad_of(f.inputs[0])};
        break;
      }
      case OpKind::gelu_forward: {
        if (!has_grad(f.outputs[0])) continue;
        b.kind = OpKind::gelu_backward;
        b.inputs = {g[f.outputs[0]].grad, f.inputs[0]};
        b.outputs = {ad.grad_of(f.inputs[0])};
        break;
      }
      case OpKind::residual_forward: {
        if (!has_grad(f.outputs[0])) continue;
        // The residual stream's gradient as ONE buffer (llm.c's dresidual): when neither input
        // has a gradient yet, both take dy itself (no zero, no copy, no op). Safe when b (the
        // branch: attention or MLP projection) has this op as its only reader and its producer
        // is the forward op just before: that producer's backward, emitted next, is then the one
        // reader of d(b) and runs before any further contribution to d(a) lands in the buffer.
        const TensorId a_in = f.inputs[0], b_in = f.inputs[1];
        if (!has_grad(a_in) && !has_grad(b_in) && a_in != b_in &&
            g[a_in].role == Role::activation && g[b_in].role == Role::activation &&
            readers[static_cast<std::size_t>(b_in)] == 1 && i > 0 &&
            g.ops[i - 1].phase == Phase::forward && g.ops[i - 1].outputs.size() == 1 &&
            g.ops[i - 1].outputs[0] == b_in) {
          g[a_in].grad = g[f.outputs[0]].grad;
          g[b_in].grad = g[f.outputs[0]].grad;
          continue;
        }
        b.kind = OpKind::residual_backward;
        b.inputs = {g[f.outputs[0]].grad};
        b.outputs = {ad.grad_of(f.inputs[0]), ad.grad_of(f.inputs[1])};
        break;
      }
      default:
        throw std::logic_error("append_backward: no gradient rule for " +
                               std::string(op_name(f.kind)) + " (run fusion after autodiff)");
    }
    ad.emit(std::move(b));
  }
}

void append_optimizer(Graph& g) {
  std::vector<TensorId> grads;
  for (auto p : g.params) grads.push_back(g[p].grad);
  g.grad_norm = g.add_tensor("grad_norm", {1}, g.precision.optimizer, Role::optimizer_state);
  g.add_op(Op{OpKind::global_norm, Phase::optimizer, "global_norm", grads, {g.grad_norm}});
  for (auto p : g.params) {
    const Tensor param = g[p];
    TensorId m =
        g.add_tensor(param.name + ".m", param.shape, g.precision.optimizer, Role::optimizer_state);
    TensorId v =
        g.add_tensor(param.name + ".v", param.shape, g.precision.optimizer, Role::optimizer_state);
    Op o{OpKind::adamw,
         Phase::optimizer,
         "adamw " + param.name,
         {param.grad, g.grad_norm, g.scalars},
         {p, m, v}};
    if (param.dtype != g.precision.optimizer) {
      // Low-precision parameters keep an fp32 master copy (llm.c `-w 1`).
      o.outputs.push_back(g.add_tensor(param.name + ".master", param.shape, g.precision.optimizer,
                                       Role::optimizer_state));
    }
    g.add_op(std::move(o));
  }
  // Gradients are zero at the start of every step (accumulation over micro-steps adds into them).
  g.add_op(Op{OpKind::zero, Phase::optimizer, "zero grads", {}, grads});
}

std::size_t classifier_backward_of(const Graph& g, std::size_t forward) {
  const Op& f = g.ops[forward];
  if (f.kind != OpKind::classifier_forward) return g.ops.size();
  for (std::size_t j = forward + 1; j < g.ops.size(); ++j) {
    const Op& b = g.ops[j];
    // (x may be a recomputed copy of the forward's x: the same values)
    if (b.kind == OpKind::classifier_backward && b.inputs[1] == f.inputs[1] &&
        b.inputs[2] == f.inputs[2])
      return j;
  }
  return g.ops.size();
}

double op_flops(const Graph& g, const Op& op) {
  auto el = [&](TensorId t) { return static_cast<double>(g[t].elements()); };
  switch (op.kind) {
    case OpKind::matmul_forward: {
      const auto& w = g[op.inputs[1]].shape;
      return 2.0 * el(op.outputs[0]) * static_cast<double>(w[1]);
    }
    case OpKind::matmul_backward: {
      const auto& w = g[op.inputs[2]].shape;
      return 4.0 * el(op.inputs[0]) * static_cast<double>(w[1]);
    }
    case OpKind::attention_forward:
    case OpKind::attention_backward: {
      const AttentionShape a =
          attention_shape(g, op, op.inputs[op.kind == OpKind::attention_forward ? 0 : 1]);
      const double B = static_cast<double>(a.B), T = static_cast<double>(a.T),
                   C = static_cast<double>(a.C);  // query channels (grouped-query: the same)
      const double pairs =
          B * T * (T + 1) / 2;  // causal (query, key) pairs summed over heads via C
      return (op.kind == OpKind::attention_forward ? 4.0 : 10.0) * pairs * C;
    }
    case OpKind::rmsnorm_forward:
    case OpKind::residual_rmsnorm_forward:
      return 5.0 * el(op.outputs[op.outputs.size() == 3 ? 1 : 0]);
    case OpKind::rmsnorm_backward:
      return 8.0 * el(op.inputs[0]);
    case OpKind::rope_forward:
    case OpKind::rope_backward:
      return 3.0 * el(op.inputs[0]);
    case OpKind::swiglu_forward:
      return 6.0 * el(op.outputs[0]);
    case OpKind::swiglu_backward:
      return 12.0 * el(op.inputs[0]);
    case OpKind::layernorm_forward:
    case OpKind::residual_layernorm_forward:
      return 8.0 * el(op.outputs[op.outputs.size() == 4 ? 1 : 0]);
    case OpKind::layernorm_backward:
      return 12.0 * el(op.inputs[0]);
    case OpKind::gelu_forward:
      return 10.0 * el(op.inputs[0]);
    case OpKind::gelu_backward:
      return 20.0 * el(op.inputs[0]);
    case OpKind::residual_forward:
      return el(op.outputs[0]);
    case OpKind::residual_backward:
      return 2.0 * el(op.inputs[0]);
    case OpKind::encoder_forward:
    case OpKind::encoder_backward:
      return 2.0 * el(op.inputs[0]) * (op.kind == OpKind::encoder_forward ? 0 : 1) +
             el(op.kind == OpKind::encoder_forward ? op.outputs[0] : op.inputs[0]);
    case OpKind::crossentropy_forward:
      return 5.0 * el(op.inputs[0]);
    case OpKind::crossentropy_backward:
      return 5.0 * el(op.inputs[0]);
    case OpKind::classifier_forward:
    case OpKind::classifier_backward: {
      const auto& w = g[op.inputs[1]].shape;  // (Vp, C)
      const double logits =
          el(op.inputs[0]) / static_cast<double>(w[1]) * static_cast<double>(w[0]);
      const double gemms = op.kind == OpKind::classifier_forward ? 1 : 2;
      return gemms * 2.0 * logits * static_cast<double>(w[1]) + 5.0 * logits;
    }
    case OpKind::adamw:
    case OpKind::sharded_adamw:
      return 12.0 * el(op.inputs[0]);
    case OpKind::global_norm:
    case OpKind::sharded_global_norm: {
      double n = 0;
      for (auto t : op.inputs) n += 2.0 * el(t);
      return n;
    }
    case OpKind::zero:
    case OpKind::all_reduce:
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
      return 0.0;
  }
  return 0.0;
}

}  // namespace topolaunch::kernels
