#pragma once

#include <torch/optim/sgd.h>

#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/optim/step_kernels.h"

namespace fulgor {

/// torch.optim.SGD with its `foreach` and `fused` implementations, which
/// LibTorch's torch::optim::SGD lacks.
///
/// Contract: a torch::optim::SGD in everything but how step() computes: the
/// same options, the same per-parameter state (SGDParamState's momentum
/// buffer, so save/load, fulgor's checkpoints and torch.optim interop treat it
/// as one), the same results up to the rounding of the kernels' order of
/// operations. With neither foreach nor fused in effect, step() is
/// torch::optim::SGD's.
class FULGOR_API SGD : public torch::optim::SGD {
 public:
  SGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, torch::optim::SGDOptions defaults,
      StepKernels kernels = {});
  SGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults, StepKernels kernels = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  const StepKernels& kernels() const { return kernels_; }

 private:
  StepKernels kernels_;
};

}  // namespace fulgor
