// Central finite differences in fp64 against analytic gradients.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "topolaunch/kernels/rng.hpp"

namespace gradcheck {

using Vec = std::vector<double>;

inline Vec random_vec(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  topolaunch::kernels::NormalRng rng(seed);
  Vec v(n);
  for (auto& x : v) x = scale * rng.normal();
  return v;
}

// Largest relative error |a - n| / max(1e-6, |a| + |n|) over all entries of all checked inputs.
// forward(inputs) -> outputs; backward(inputs, dout) -> gradients (one per input, empty = skip).
inline double max_relative_error(
    std::vector<Vec> inputs, const std::function<Vec(const std::vector<Vec>&)>& forward,
    const std::function<std::vector<Vec>(const std::vector<Vec>&, const Vec&)>& backward,
    std::uint64_t seed = 7) {
  const Vec out = forward(inputs);
  const Vec r = random_vec(out.size(), seed);
  auto objective = [&](const std::vector<Vec>& in) {
    const Vec o = forward(in);
    double s = 0;
    for (std::size_t i = 0; i < o.size(); ++i) s += r[i] * o[i];
    return s;
  };
  const auto grads = backward(inputs, r);
  double worst = 0;
  const double eps = 1e-6;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (grads[k].empty()) continue;
    for (std::size_t i = 0; i < inputs[k].size(); ++i) {
      const double saved = inputs[k][i];
      inputs[k][i] = saved + eps;
      const double up = objective(inputs);
      inputs[k][i] = saved - eps;
      const double down = objective(inputs);
      inputs[k][i] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double err = std::abs(grads[k][i] - numeric) /
                         std::max(1e-6, std::abs(grads[k][i]) + std::abs(numeric));
      worst = std::max(worst, err);
    }
  }
  return worst;
}

}  // namespace gradcheck
