#include "fulgor/optim/adam.h"

#include <utility>

#include "optim/adam_step.h"

namespace fulgor {

Adam::Adam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, torch::optim::AdamOptions defaults,
           StepKernels kernels)
    : torch::optim::Adam(param_groups, std::move(defaults)),
      kernels_(kernels),
      fused_steps_(std::make_unique<detail::FusedStepCounts>()) {
  detail::check_step_kernels(kernels_, "fulgor::Adam");
}

Adam::Adam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults, StepKernels kernels)
    : Adam({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults), kernels) {}

Adam::~Adam() = default;

torch::Tensor Adam::step(LossClosure closure) {
  if (!kernels_.fused && !detail::takes_foreach(kernels_, param_groups())) return torch::optim::Adam::step(closure);
  return detail::grouped_adam_step<torch::optim::AdamParamState, torch::optim::AdamOptions>(
      *this, closure, kernels_.fused, /*decoupled=*/false, *fused_steps_, "fulgor::Adam");
}

}  // namespace fulgor
