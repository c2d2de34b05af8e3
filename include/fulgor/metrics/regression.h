#pragma once

#include <torch/types.h>

#include "fulgor/core/export.h"
#include "fulgor/metrics/metric.h"

namespace fulgor::metrics {

/// The mean of (preds - target)^2 over every element; with `squared` false
/// its square root (torchmetrics' squared=False). preds and target have one
/// shape.
class FULGOR_API MeanSquaredError final : public PredictionMetric {
 public:
  explicit MeanSquaredError(bool squared = true);

 private:
  torch::Tensor compute_from(const std::vector<torch::Tensor>& states) const override;
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;

  bool squared_;
  size_t sum_, count_;
};

/// The mean of |preds - target| over every element. preds and target have
/// one shape.
class FULGOR_API MeanAbsoluteError final : public PredictionMetric {
 public:
  MeanAbsoluteError();

 private:
  torch::Tensor compute_from(const std::vector<torch::Tensor>& states) const override;
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;

  size_t sum_, count_;
};

}  // namespace fulgor::metrics
