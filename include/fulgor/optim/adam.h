#pragma once

#include <torch/optim/adam.h>

#include <memory>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/optim/step_kernels.h"

namespace fulgor {

namespace detail {
class FusedStepCounts;
}

/// torch.optim.Adam with its `foreach` and `fused` implementations, which
/// LibTorch's torch::optim::Adam lacks.
///
///   fulgor::StepKernels kernels;
///   kernels.fused = true;
///   auto adam = std::make_shared<fulgor::Adam>(parameters(), torch::optim::AdamOptions(1e-3), kernels);
///
/// Contract: a torch::optim::Adam in everything but how step() computes: the
/// same options, the same per-parameter state (AdamParamState, so save/load,
/// fulgor's checkpoints and torch.optim interop treat it as one), the same
/// results up to the rounding of the kernels' order of operations. With
/// neither foreach nor fused in effect, step() is torch::optim::Adam's.
class FULGOR_API Adam : public torch::optim::Adam {
 public:
  explicit Adam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                torch::optim::AdamOptions defaults = {}, StepKernels kernels = {});
  explicit Adam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults = {}, StepKernels kernels = {});
  ~Adam() override;

  torch::Tensor step(LossClosure closure = nullptr) override;
  const StepKernels& kernels() const { return kernels_; }

 private:
  StepKernels kernels_;
  std::unique_ptr<detail::FusedStepCounts> fused_steps_;
};

}  // namespace fulgor
