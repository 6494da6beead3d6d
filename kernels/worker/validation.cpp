// Validation loss (validation.hpp).
#include "topolaunch/kernels/validation.hpp"

#include <vector>

namespace topolaunch::kernels {

Result<std::int64_t> validation_windows(const Dataset& val, const std::string& path,
                                        std::int64_t wanted, std::int64_t B, std::int64_t T,
                                        int world) {
  const std::int64_t stride = static_cast<std::int64_t>(world) * B * T;
  const std::int64_t n = static_cast<std::int64_t>(val.tokens.size());
  const std::int64_t fit = n > 0 ? (n - 1) / stride : 0;
  if (fit < 1)
    return make_error("data.val_path: " + path + ": " + std::to_string(n) +
                      " tokens are fewer than one validation batch needs (" +
                      std::to_string(stride + 1) + " = ranks x batch x seq_len + 1)");
  return std::min(fit, wanted);
}

Result<double> validation_loss(TrainingExecutor& ex, const Dataset& val, std::int64_t windows,
                               std::int64_t B, std::int64_t T) {
  const std::int64_t local = B * T, stride = static_cast<std::int64_t>(ex.world_size()) * local;
  std::vector<std::int32_t> x(static_cast<std::size_t>(local)), y(x.size());
  double sum = 0;
  for (std::int64_t w = 0; w < windows; ++w) {
    const std::int64_t base = w * stride + static_cast<std::int64_t>(ex.rank()) * local;
    for (std::int64_t i = 0; i < local; ++i) {
      x[static_cast<std::size_t>(i)] = val.tokens[static_cast<std::size_t>(base + i)];
      y[static_cast<std::size_t>(i)] = val.tokens[static_cast<std::size_t>(base + i + 1)];
    }
    auto l = ex.evaluate_loss(x, y);
    if (!l) return l.error();
    sum += *l;
  }
  double mean[1] = {sum / static_cast<double>(windows * ex.world_size())};
  if (auto s = ex.sum_over_ranks(mean, "validation loss all-reduce"); !s) return s.error();
  return mean[0];
}

}  // namespace topolaunch::kernels
