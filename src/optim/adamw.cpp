#include "fulgor/optim/adamw.h"

#include <utility>

#include "optim/adam_step.h"

namespace fulgor {

AdamW::AdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, torch::optim::AdamWOptions defaults,
             StepKernels kernels)
    : torch::optim::AdamW(param_groups, std::move(defaults)),
      kernels_(kernels),
      fused_steps_(std::make_unique<detail::FusedStepCounts>()) {
  detail::check_step_kernels(kernels_, "fulgor::AdamW");
}

AdamW::AdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults, StepKernels kernels)
    : AdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults), kernels) {}

AdamW::~AdamW() = default;

torch::Tensor AdamW::step(LossClosure closure) {
  if (!kernels_.fused && !detail::takes_foreach(kernels_, param_groups())) return torch::optim::AdamW::step(closure);
  return detail::grouped_adam_step<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(
      *this, closure, kernels_.fused, /*decoupled=*/true, *fused_steps_, "fulgor::AdamW");
}

}  // namespace fulgor
