#include "fulgor/metrics/regression.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "fulgor/core/error.h"

namespace fulgor::metrics {
namespace {

// The elementwise difference, in float64 so that long epochs sum exactly.
torch::Tensor difference(const torch::Tensor& preds, const torch::Tensor& target, const char* metric) {
  if (preds.sizes() != target.sizes())
    throw ConfigError(fmt::format("{}: preds [{}] and target [{}] must have the same shape", metric,
                                  fmt::join(preds.sizes(), ", "), fmt::join(target.sizes(), ", ")));
  return preds.detach().to(torch::kDouble) - target.detach().to(torch::kDouble);
}

}  // namespace

MeanSquaredError::MeanSquaredError(bool squared) : squared_(squared) {
  sum_ = add_state(torch::zeros({}, torch::kDouble), Merge::sum);
  count_ = add_state(torch::zeros({}, torch::kLong), Merge::sum);
}

void MeanSquaredError::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  state(sum_).add_(difference(preds, target, "MeanSquaredError").square().sum());
  state(count_).add_(target.numel());
}

torch::Tensor MeanSquaredError::compute_from(const std::vector<torch::Tensor>& s) const {
  const torch::Tensor mean = s[sum_] / s[count_].to(torch::kDouble);
  return squared_ ? mean : mean.sqrt();
}

MeanAbsoluteError::MeanAbsoluteError() {
  sum_ = add_state(torch::zeros({}, torch::kDouble), Merge::sum);
  count_ = add_state(torch::zeros({}, torch::kLong), Merge::sum);
}

void MeanAbsoluteError::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  state(sum_).add_(difference(preds, target, "MeanAbsoluteError").abs().sum());
  state(count_).add_(target.numel());
}

torch::Tensor MeanAbsoluteError::compute_from(const std::vector<torch::Tensor>& s) const {
  return s[sum_] / s[count_].to(torch::kDouble);
}

}  // namespace fulgor::metrics
