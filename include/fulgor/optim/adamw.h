#pragma once

#include <torch/optim/adamw.h>

#include <memory>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/optim/step_kernels.h"

namespace fulgor {

namespace detail {
class FusedStepCounts;
}

/// torch.optim.AdamW with its `foreach` and `fused` implementations, which
/// LibTorch's torch::optim::AdamW lacks.
///
///   fulgor::StepKernels kernels;
///   kernels.fused = true;
///   auto adamw = std::make_shared<fulgor::AdamW>(parameters(), torch::optim::AdamWOptions(1e-3), kernels);
///
/// Contract: a torch::optim::AdamW in everything but how step() computes: the
/// same options, the same per-parameter state (AdamWParamState, so save/load,
/// fulgor's checkpoints and torch.optim interop treat it as one), the same
/// results up to the rounding of the kernels' order of operations. With
/// neither foreach nor fused in effect, step() is torch::optim::AdamW's.
class FULGOR_API AdamW : public torch::optim::AdamW {
 public:
  explicit AdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                 torch::optim::AdamWOptions defaults = {}, StepKernels kernels = {});
  explicit AdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults = {}, StepKernels kernels = {});
  ~AdamW() override;

  torch::Tensor step(LossClosure closure = nullptr) override;
  const StepKernels& kernels() const { return kernels_; }

 private:
  StepKernels kernels_;
  std::unique_ptr<detail::FusedStepCounts> fused_steps_;
};

}  // namespace fulgor
