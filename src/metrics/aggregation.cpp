#include "fulgor/metrics/aggregation.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "fulgor/core/error.h"

namespace fulgor::metrics {

MeanMetric::MeanMetric() {
  sum_ = add_state(torch::zeros({}, torch::kDouble), Merge::sum);
  weight_ = add_state(torch::zeros({}, torch::kDouble), Merge::sum);
}

void MeanMetric::update(const torch::Tensor& value, const torch::Tensor& weight) {
  torch::Tensor w;
  try {
    w = weight.detach().to(value.device(), torch::kDouble).expand(value.sizes());
  } catch (const c10::Error&) {
    throw ConfigError(fmt::format("MeanMetric: weight [{}] does not broadcast to value [{}]",
                                  fmt::join(weight.sizes(), ", "), fmt::join(value.sizes(), ", ")));
  }
  add(value, w);
}

void MeanMetric::update(const torch::Tensor& value, double weight) {
  // A weight made on the value's device: no copy from the host per batch.
  add(value, torch::full(value.sizes(), weight, value.options().dtype(torch::kDouble)));
}

void MeanMetric::add(const torch::Tensor& value, const torch::Tensor& weight) {
  begin_update(value);
  torch::NoGradGuard no_grad;
  const torch::Tensor v = value.detach().to(torch::kDouble);
  const torch::Tensor nan = v.isnan();
  state(sum_).add_(torch::where(nan, torch::zeros_like(v), v * weight).sum());
  state(weight_).add_(torch::where(nan, torch::zeros_like(weight), weight).sum());
}

torch::Tensor MeanMetric::compute_from(const std::vector<torch::Tensor>& s) const { return s[sum_] / s[weight_]; }

}  // namespace fulgor::metrics
