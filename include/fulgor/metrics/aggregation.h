#pragma once

#include <torch/types.h>

#include "fulgor/core/export.h"
#include "fulgor/metrics/metric.h"

namespace fulgor::metrics {

/// The weighted mean of every value given: sum(value * weight) /
/// sum(weight), as torchmetrics' MeanMetric. NaN values are left out, with
/// their weights (torchmetrics' default nan_strategy, without its warning,
/// which would read the values on the host).
class FULGOR_API MeanMetric final : public Metric {
 public:
  MeanMetric();

  /// `value` of any shape; `weight` a number or a tensor that broadcasts to it.
  void update(const torch::Tensor& value, const torch::Tensor& weight);
  void update(const torch::Tensor& value, double weight = 1.0);
  torch::Tensor forward(const torch::Tensor& value, double weight = 1.0) {
    return forward_with([&] { update(value, weight); });
  }
  torch::Tensor operator()(const torch::Tensor& value, double weight = 1.0) { return forward(value, weight); }

 private:
  torch::Tensor compute_from(const std::vector<torch::Tensor>& states) const override;
  void add(const torch::Tensor& value, const torch::Tensor& weight);

  size_t sum_, weight_;
};

}  // namespace fulgor::metrics
