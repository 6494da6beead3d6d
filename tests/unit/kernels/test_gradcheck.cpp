// Every op's backward against central finite differences in fp64, then the whole GPT-2, LLaMA and
// MLP training graphs (autodiff + fusion + the CPU backend) the same way.
#include <cmath>

#include "adamw.hpp"
#include "attention.hpp"
#include "catch.hpp"
#include "classifier.hpp"
#include "encoder.hpp"
#include "gelu.hpp"
#include "gradcheck.hpp"
#include "layernorm.hpp"
#include "matmul.hpp"
#include "residual.hpp"
#include "rmsnorm.hpp"
#include "rope.hpp"
#include "swiglu.hpp"
#include "topolaunch/kernels/cpu_backend.hpp"

using namespace topolaunch::kernels;
using gradcheck::Vec;

namespace {
constexpr double kTolerance = 1e-5;
}

TEST_CASE("matmul backward matches finite differences (with bias)") {
  const std::int64_t N = 5, C = 7, OC = 6;  // N not a multiple of the 4-row tile
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(N * OC);
    cpu::matmul_forward(y.data(), in[0].data(), in[1].data(), in[2].data(), N, C, OC);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>& in, const Vec& dy) {
    std::vector<Vec> g{Vec(N * C), Vec(OC * C), Vec(OC)};
    cpu::matmul_backward(g[0].data(), g[1].data(), g[2].data(), dy.data(), in[0].data(),
                         in[1].data(), N, C, OC);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error(
              {gradcheck::random_vec(N * C, 1), gradcheck::random_vec(OC * C, 2),
               gradcheck::random_vec(OC, 3)},
              fwd, bwd) < kTolerance);
}

TEST_CASE("layernorm backward matches finite differences") {
  const std::int64_t N = 4, C = 9;
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(N * C), m(N), r(N);
    cpu::layernorm_forward(y.data(), m.data(), r.data(), in[0].data(), in[1].data(), in[2].data(),
                           N, C);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>& in, const Vec& dy) {
    Vec y(N * C), m(N), r(N);
    cpu::layernorm_forward(y.data(), m.data(), r.data(), in[0].data(), in[1].data(), in[2].data(),
                           N, C);
    std::vector<Vec> g{Vec(N * C), Vec(C), Vec(C)};
    cpu::layernorm_backward(g[0].data(), g[1].data(), g[2].data(), dy.data(), in[0].data(),
                            in[1].data(), m.data(), r.data(), N, C);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error({gradcheck::random_vec(N * C, 4),
                                         gradcheck::random_vec(C, 5), gradcheck::random_vec(C, 6)},
                                        fwd, bwd) < kTolerance);
}

TEST_CASE("fused residual+layernorm equals residual then layernorm") {
  const std::int64_t N = 3, C = 8;
  Vec a = gradcheck::random_vec(N * C, 1), b = gradcheck::random_vec(N * C, 2),
      w = gradcheck::random_vec(C, 3), bias = gradcheck::random_vec(C, 4);
  Vec s1(N * C), y1(N * C), m1(N), r1(N), s2(N * C), y2(N * C), m2(N), r2(N);
  cpu::residual_forward(s1.data(), a.data(), b.data(), N * C);
  cpu::layernorm_forward(y1.data(), m1.data(), r1.data(), s1.data(), w.data(), bias.data(), N, C);
  cpu::residual_layernorm_forward(s2.data(), y2.data(), m2.data(), r2.data(), a.data(), b.data(),
                                  w.data(), bias.data(), N, C);
  REQUIRE(s1 == s2);
  REQUIRE(y1 == y2);
  REQUIRE(r1 == r2);
}

TEST_CASE("causal attention backward matches finite differences") {
  const std::int64_t B = 2, T = 5, C = 8, NH = 2;
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(B * T * C), lse(B * NH * T), scratch(B * NH * T);
    cpu::attention_forward(y.data(), lse.data(), scratch.data(), in[0].data(), B, T, C, NH);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>& in, const Vec& dy) {
    Vec y(B * T * C), lse(B * NH * T), scratch(B * NH * T);
    cpu::attention_forward(y.data(), lse.data(), scratch.data(), in[0].data(), B, T, C, NH);
    std::vector<Vec> g{Vec(B * T * 3 * C)};
    cpu::attention_backward(g[0].data(), scratch.data(), dy.data(), in[0].data(), y.data(),
                            lse.data(), B, T, C, NH);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error({gradcheck::random_vec(B * T * 3 * C, 8)}, fwd, bwd) <
          kTolerance);
}

TEST_CASE("causal attention: output at t does not depend on tokens after t") {
  const std::int64_t B = 1, T = 4, C = 4, NH = 1;
  Vec qkv = gradcheck::random_vec(B * T * 3 * C, 9), y1(B * T * C), y2(B * T * C), lse(T), s(T);
  cpu::attention_forward(y1.data(), lse.data(), s.data(), qkv.data(), B, T, C, NH);
  for (std::int64_t i = 0; i < 3 * C; ++i)
    qkv[static_cast<std::size_t>((T - 1) * 3 * C + i)] += 1.0;
  cpu::attention_forward(y2.data(), lse.data(), s.data(), qkv.data(), B, T, C, NH);
  for (std::int64_t i = 0; i < (T - 1) * C; ++i)
    REQUIRE(y1[static_cast<std::size_t>(i)] == y2[static_cast<std::size_t>(i)]);
}

TEST_CASE("grouped-query attention backward matches finite differences (4 query heads, 2 kv)") {
  const std::int64_t B = 2, T = 5, C = 8, NH = 4, NKV = 2, W = C + 2 * (C / NH * NKV);
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(B * T * C), lse(B * NH * T), scratch(B * NH * T);
    cpu::attention_forward(y.data(), lse.data(), scratch.data(), in[0].data(), B, T, C, NH, NKV);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>& in, const Vec& dy) {
    Vec y(B * T * C), lse(B * NH * T), scratch(B * NH * T);
    cpu::attention_forward(y.data(), lse.data(), scratch.data(), in[0].data(), B, T, C, NH, NKV);
    std::vector<Vec> g{Vec(B * T * W)};
    cpu::attention_backward(g[0].data(), scratch.data(), dy.data(), in[0].data(), y.data(),
                            lse.data(), B, T, C, NH, NKV);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error({gradcheck::random_vec(B * T * W, 30)}, fwd, bwd) <
          kTolerance);
}

TEST_CASE("grouped-query attention with one kv head per query head equals multi-head attention") {
  const std::int64_t B = 1, T = 6, C = 8, NH = 2;
  Vec qkv = gradcheck::random_vec(B * T * 3 * C, 31), y1(B * T * C), y2(B * T * C), l1(B * NH * T),
      l2(B * NH * T), s(B * NH * T);
  cpu::attention_forward(y1.data(), l1.data(), s.data(), qkv.data(), B, T, C, NH);
  cpu::attention_forward(y2.data(), l2.data(), s.data(), qkv.data(), B, T, C, NH, NH);
  REQUIRE(y1 == y2);
  REQUIRE(l1 == l2);
}

TEST_CASE("grouped-query attention: query heads of one group read the same key/value head") {
  // Two query heads with equal q over one kv head give equal outputs; a change to the second kv
  // head's keys changes only the second group's heads.
  const std::int64_t B = 1, T = 4, C = 8, NH = 4, NKV = 2, hs = C / NH, W = C + 2 * hs * NKV;
  Vec qkv = gradcheck::random_vec(B * T * W, 32);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < hs; ++i)
      qkv[static_cast<std::size_t>(t * W + hs + i)] = qkv[static_cast<std::size_t>(t * W + i)];
  Vec y1(B * T * C), y2(B * T * C), lse(B * NH * T), s(B * NH * T);
  cpu::attention_forward(y1.data(), lse.data(), s.data(), qkv.data(), B, T, C, NH, NKV);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < hs; ++i) {
      INFO("t " << t << " channel " << i);
      REQUIRE(y1[static_cast<std::size_t>(t * C + i)] ==
              y1[static_cast<std::size_t>(t * C + hs + i)]);
    }
  for (std::int64_t t = 0; t < T; ++t) qkv[static_cast<std::size_t>(t * W + C + hs)] += 0.5;
  cpu::attention_forward(y2.data(), lse.data(), s.data(), qkv.data(), B, T, C, NH, NKV);
  for (std::int64_t t = 1; t < T; ++t) {
    for (std::int64_t i = 0; i < 2 * hs; ++i)
      REQUIRE(y1[static_cast<std::size_t>(t * C + i)] == y2[static_cast<std::size_t>(t * C + i)]);
    bool changed = false;
    for (std::int64_t i = 2 * hs; i < C; ++i)
      changed |= y1[static_cast<std::size_t>(t * C + i)] != y2[static_cast<std::size_t>(t * C + i)];
    REQUIRE(changed);
  }
}

TEST_CASE("rmsnorm backward matches finite differences") {
  const std::int64_t N = 4, C = 9;
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(N * C), r(N);
    cpu::rmsnorm_forward(y.data(), r.data(), in[0].data(), in[1].data(), N, C);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>& in, const Vec& dy) {
    Vec y(N * C), r(N);
    cpu::rmsnorm_forward(y.data(), r.data(), in[0].data(), in[1].data(), N, C);
    std::vector<Vec> g{Vec(N * C), Vec(C)};
    cpu::rmsnorm_backward(g[0].data(), g[1].data(), dy.data(), in[0].data(), in[1].data(), r.data(),
                          N, C);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error(
              {gradcheck::random_vec(N * C, 33), gradcheck::random_vec(C, 34)}, fwd, bwd) <
          kTolerance);
}

TEST_CASE("rmsnorm: unit weights give rows of mean square 1 (up to eps)") {
  const std::int64_t N = 3, C = 16;
  Vec x = gradcheck::random_vec(N * C, 35, 3.0), w(C, 1.0), y(N * C), r(N);
  cpu::rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C);
  for (std::int64_t n = 0; n < N; ++n) {
    double ms = 0, xs = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      ms += y[static_cast<std::size_t>(n * C + c)] * y[static_cast<std::size_t>(n * C + c)];
      xs += x[static_cast<std::size_t>(n * C + c)] * x[static_cast<std::size_t>(n * C + c)];
    }
    REQUIRE(ms / C == Approx(1.0 / (1.0 + cpu::kRmsNormEpsilon * C / xs)).epsilon(1e-12));
  }
}

TEST_CASE("fused residual+rmsnorm equals residual then rmsnorm") {
  const std::int64_t N = 3, C = 8;
  Vec a = gradcheck::random_vec(N * C, 36), b = gradcheck::random_vec(N * C, 37),
      w = gradcheck::random_vec(C, 38);
  Vec s1(N * C), y1(N * C), r1(N), s2(N * C), y2(N * C), r2(N);
  cpu::residual_forward(s1.data(), a.data(), b.data(), N * C);
  cpu::rmsnorm_forward(y1.data(), r1.data(), s1.data(), w.data(), N, C);
  cpu::residual_rmsnorm_forward(s2.data(), y2.data(), r2.data(), a.data(), b.data(), w.data(), N,
                                C);
  REQUIRE(s1 == s2);
  REQUIRE(y1 == y2);
  REQUIRE(r1 == r2);
}

TEST_CASE("rope backward matches finite differences (grouped-query layout, v passed through)") {
  const std::int64_t B = 2, T = 5, C = 8, NH = 2, NKV = 1, W = C + 2 * (C / NH * NKV);
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(B * T * W);
    cpu::rope_forward(y.data(), in[0].data(), B, T, C, NH, NKV, 10000.0);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>&, const Vec& dy) {
    std::vector<Vec> g{Vec(B * T * W)};
    cpu::rope_backward(g[0].data(), dy.data(), B, T, C, NH, NKV, 10000.0);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error({gradcheck::random_vec(B * T * W, 39)}, fwd, bwd) <
          kTolerance);
}

TEST_CASE("rope: position 0 is the identity, v is copied, and q.k depends only on the offset") {
  // Rotating q at t and k at s by their positions makes q.k a function of t - s (RoPE's point).
  const std::int64_t B = 1, T = 6, C = 4, NH = 1, NKV = 1, W = 3 * C;
  Vec qkv(B * T * W);
  const Vec q = gradcheck::random_vec(C, 40), k = gradcheck::random_vec(C, 41),
            v = gradcheck::random_vec(C, 42);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < C; ++i) {
      qkv[static_cast<std::size_t>(t * W + i)] = q[static_cast<std::size_t>(i)];
      qkv[static_cast<std::size_t>(t * W + C + i)] = k[static_cast<std::size_t>(i)];
      qkv[static_cast<std::size_t>(t * W + 2 * C + i)] = v[static_cast<std::size_t>(i)];
    }
  Vec out(B * T * W);
  cpu::rope_forward(out.data(), qkv.data(), B, T, C, NH, NKV, 10000.0);
  for (std::int64_t i = 0; i < W; ++i)
    REQUIRE(out[static_cast<std::size_t>(i)] == qkv[static_cast<std::size_t>(i)]);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 2 * C; i < W; ++i)
      REQUIRE(out[static_cast<std::size_t>(t * W + i)] == qkv[static_cast<std::size_t>(t * W + i)]);
  auto dot = [&](std::int64_t t, std::int64_t s) {
    double d = 0;
    for (std::int64_t i = 0; i < C; ++i)
      d += out[static_cast<std::size_t>(t * W + i)] * out[static_cast<std::size_t>(s * W + C + i)];
    return d;
  };
  REQUIRE(dot(3, 1) == Approx(dot(5, 3)).epsilon(1e-12));
  REQUIRE(dot(2, 2) == Approx(dot(0, 0)).epsilon(1e-12));
  REQUIRE(dot(4, 0) != Approx(dot(4, 1)).epsilon(1e-6));
}

TEST_CASE("swiglu backward matches finite differences") {
  const std::int64_t N = 3, H = 5;
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(N * H);
    cpu::swiglu_forward(y.data(), in[0].data(), N, H);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>& in, const Vec& dy) {
    std::vector<Vec> g{Vec(N * 2 * H)};
    cpu::swiglu_backward(g[0].data(), dy.data(), in[0].data(), N, H);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error({gradcheck::random_vec(N * 2 * H, 43, 2.0)}, fwd, bwd) <
          kTolerance);
}

TEST_CASE("swiglu: h = g sigmoid(g) u, row by row") {
  const Vec gu = {1.0, -2.0, 0.5, 3.0};  // one row, H = 2: g = (1, -2), u = (0.5, 3)
  Vec h(2);
  cpu::swiglu_forward(h.data(), gu.data(), 1, 2);
  REQUIRE(h[0] == Approx(1.0 / (1.0 + std::exp(-1.0)) * 0.5));
  REQUIRE(h[1] == Approx(-2.0 / (1.0 + std::exp(2.0)) * 3.0));
}

TEST_CASE("gelu backward matches finite differences") {
  const std::int64_t n = 17;
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(n);
    cpu::gelu_forward(y.data(), in[0].data(), n);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>& in, const Vec& dy) {
    std::vector<Vec> g{Vec(n)};
    cpu::gelu_backward(g[0].data(), dy.data(), in[0].data(), n);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error({gradcheck::random_vec(n, 10, 2.0)}, fwd, bwd) <
          kTolerance);
}

TEST_CASE("residual backward matches finite differences") {
  const std::int64_t n = 6;
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(n);
    cpu::residual_forward(y.data(), in[0].data(), in[1].data(), n);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>&, const Vec& dy) {
    std::vector<Vec> g{Vec(n), Vec(n)};
    cpu::residual_backward(g[0].data(), g[1].data(), dy.data(), n);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error(
              {gradcheck::random_vec(n, 11), gradcheck::random_vec(n, 12)}, fwd, bwd) < kTolerance);
}

TEST_CASE("encoder backward matches finite differences, repeated tokens accumulate") {
  const std::int64_t B = 2, T = 3, C = 4, V = 5;
  const std::vector<std::int32_t> tokens = {1, 3, 1, 4, 1, 0};
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(B * T * C);
    cpu::encoder_forward(y.data(), tokens.data(), in[0].data(), in[1].data(), B, T, C);
    return y;
  };
  auto bwd = [&](const std::vector<Vec>&, const Vec& dy) {
    std::vector<Vec> g{Vec(V * C), Vec(T * C)};
    cpu::encoder_backward(g[0].data(), g[1].data(), dy.data(), tokens.data(), B, T, C);
    return g;
  };
  REQUIRE(gradcheck::max_relative_error(
              {gradcheck::random_vec(V * C, 13), gradcheck::random_vec(T * C, 14)}, fwd, bwd) <
          kTolerance);
}

TEST_CASE("softmax cross-entropy backward matches finite differences; padding gets zero gradient") {
  const std::int64_t N = 3, V = 5, Vp = 8;
  const std::vector<std::int32_t> targets = {0, 4, 2};
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec l(N);
    cpu::crossentropy_forward(l.data(), in[0].data(), targets.data(), N, V, Vp);
    return l;
  };
  Vec padded_grad;
  auto bwd = [&](const std::vector<Vec>& in, const Vec& dl) {
    // The kernel takes one scale for all rows (the mean-loss seed); apply per-row weights after.
    std::vector<Vec> g{Vec(N * Vp)};
    cpu::crossentropy_backward(g[0].data(), in[0].data(), targets.data(), 1.0, N, V, Vp);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t i = 0; i < Vp; ++i)
        g[0][static_cast<std::size_t>(n * Vp + i)] *= dl[static_cast<std::size_t>(n)];
    padded_grad = g[0];
    return g;
  };
  Vec logits = gradcheck::random_vec(N * Vp, 15);
  REQUIRE(gradcheck::max_relative_error({logits}, fwd, bwd) < kTolerance);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t i = V; i < Vp; ++i)
      REQUIRE(padded_grad[static_cast<std::size_t>(n * Vp + i)] == 0.0);
  // In place (dlogits aliases logits) gives the same values.
  Vec inplace = logits;
  cpu::crossentropy_backward(inplace.data(), inplace.data(), targets.data(), 1.0, N, V, Vp);
  Vec separate(N * Vp);
  cpu::crossentropy_backward(separate.data(), logits.data(), targets.data(), 1.0, N, V, Vp);
  REQUIRE(inplace == separate);
}

TEST_CASE("adamw: one step equals the closed form; weight decay only where decayed") {
  Vec p = {1.0, -2.0}, m = {0, 0}, v = {0, 0}, g = {0.5, -0.25};
  cpu::AdamWScalars s{0.1, 0.9, 0.95, 1e-8, 0.1, 1, 1.0};
  Vec p2 = p, m2 = m, v2 = v;
  cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), 2, s, true);
  cpu::adamw_update(p2.data(), m2.data(), v2.data(), g.data(), 2, s, false);
  // Step 1: mhat = g, vhat = g^2, so the update is lr * (sign(g) + wd * p).
  REQUIRE(p[0] == Approx(1.0 - 0.1 * (1.0 + 0.1 * 1.0)).epsilon(1e-7));
  REQUIRE(p[1] == Approx(-2.0 - 0.1 * (-1.0 + 0.1 * -2.0)).epsilon(1e-7));
  REQUIRE(p2[0] == Approx(1.0 - 0.1).epsilon(1e-7));
  REQUIRE(cpu::sum_of_squares(g.data(), 2) == Approx(0.3125));
}

namespace {

// Loss of the whole model vs parameters: analytic (autodiff graph on the CPU backend) vs finite
// differences on every parameter element.
double whole_model_error(Graph graph, std::uint64_t seed) {
  append_backward(graph);
  append_optimizer(graph);
  PlanOptions opt;
  auto plan = compile_plan(std::move(graph), opt);
  REQUIRE(plan.ok());
  CpuExecutor<double> ex(*plan);
  const Graph& g = ex.plan().graph;
  ex.init_parameters(seed);
  NormalRng rng(seed + 1);
  for (auto p : g.params)  // larger than the GPT-2 init so every path carries signal
    for (auto& x : ex.values(p)) x += 0.3 * rng.normal();
  for (auto& t : std::span(ex.ints(g.tokens), static_cast<std::size_t>(g[g.tokens].elements())))
    t = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(g.vocab));
  for (auto& t : std::span(ex.ints(g.targets), static_cast<std::size_t>(g[g.targets].elements())))
    t = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(g.vocab));
  ex.set_loss_scale(1.0 / static_cast<double>(g[g.losses].elements()));
  REQUIRE(ex.run_forward_backward(nullptr).ok());
  double worst = 0;
  const double eps = 1e-6;
  for (auto p : g.params) {
    auto values = ex.values(p);
    auto grads = ex.values(g[p].grad);
    // Padded vocabulary rows of wte only receive gradient through the (ignored) padded logits.
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double saved = values[i];
      values[i] = saved + eps;
      REQUIRE(ex.run_forward().ok());
      const double up = ex.mean_loss();
      values[i] = saved - eps;
      REQUIRE(ex.run_forward().ok());
      const double down = ex.mean_loss();
      values[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      // Central differences carry ~1e-10 absolute noise here (some gradients are exactly zero, e.g.
      // the key bias, which softmax cancels): relative error with a 1e-4 floor on the scale.
      const double err =
          std::abs(grads[i] - numeric) / std::max(1e-4, std::abs(grads[i]) + std::abs(numeric));
      if (err > 1e-5)
        WARN(g[p].name << "[" << i << "]: analytic " << grads[i] << " numeric " << numeric);
      worst = std::max(worst, err);
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("whole GPT-2 graph: autodiff + fusion gradients match finite differences (fp64)") {
  GptConfig c;
  c.n_layer = 2;
  c.n_embd = 8;
  c.n_head = 2;
  c.block_size = 6;
  c.vocab_size = 7;
  c.padded_vocab = 8;
  c.batch = 2;
  c.seq_len = 5;
  REQUIRE(whole_model_error(build_gpt2(c, {DType::f64, DType::f64, DType::f64}), 21) < 1e-5);
}

TEST_CASE("whole LLaMA graph: autodiff + fusion gradients match finite differences (fp64)") {
  LlamaConfig c;
  c.n_layer = 2;
  c.n_embd = 8;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_hidden = 12;
  c.vocab_size = 7;
  c.padded_vocab = 8;
  c.batch = 2;
  c.seq_len = 5;
  Graph g = build_llama(c, {DType::f64, DType::f64, DType::f64});
  // RMSNorm, rope, grouped-query attention, SwiGLU, an untied head, no biases.
  std::size_t biases = 0;
  for (auto p : g.params) biases += g[p].shape.size() == 1 && g[p].init_value == 0;
  CHECK(biases == 0);
  REQUIRE(whole_model_error(std::move(g), 23) < 1e-5);
}

TEST_CASE("whole MLP graph: gradients match finite differences (fp64)") {
  MlpConfig c;
  c.vocab_size = 6;
  c.n_embd = 5;
  c.hidden = {7, 4};
  c.batch = 2;
  c.seq_len = 3;
  REQUIRE(whole_model_error(build_mlp(c, {DType::f64, DType::f64, DType::f64}), 22) < 1e-5);
}
