#include "fulgor/optim/sgd.h"

#include <torch/torch.h>

#include <utility>

#include "optim/grouped_step.h"

namespace fulgor {
namespace {

struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

// torch.optim's _multi_tensor_sgd, with LibTorch's arithmetic
// (torch/csrc/api/src/optim/sgd.cpp): a parameter's first momentum step
// copies its gradient into the buffer.
void foreach_sgd(torch::optim::Optimizer& self, const std::vector<torch::Tensor>& params, const SgdHyper& h) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  if (h.weight_decay != 0) grads = torch::_foreach_add(grads, params, h.weight_decay);
  if (h.momentum != 0) {
    std::vector<torch::Tensor> buffers, continued, continued_grads;
    for (size_t i = 0; i < params.size(); ++i) {
      auto* state = detail::param_state_of<torch::optim::SGDParamState>(self, params[i]);
      if (state) {
        continued.push_back(state->momentum_buffer());
        continued_grads.push_back(grads[i]);
        buffers.push_back(state->momentum_buffer());
      } else {
        auto made = std::make_unique<torch::optim::SGDParamState>();
        made->momentum_buffer(torch::clone(grads[i]).detach());
        buffers.push_back(made->momentum_buffer());
        detail::compat::set_optimizer_param_state(self, params[i], std::move(made));
      }
    }
    if (!continued.empty()) {
      torch::_foreach_mul_(continued, h.momentum);
      torch::_foreach_add_(continued, continued_grads, 1 - h.dampening);
    }
    if (h.nesterov)
      grads = torch::_foreach_add(grads, buffers, h.momentum);
    else
      grads = buffers;
  }
  torch::_foreach_add_(params, grads, -h.lr);
}

// torch.optim's _fused_sgd. The kernel copies the gradients into the buffers
// on their first step (is_first_step), so the parameters that have a buffer
// and those that have none yet take one call each.
void fused_sgd(torch::optim::Optimizer& self, const std::vector<torch::Tensor>& params, const SgdHyper& h,
               const c10::OperatorHandle& op) {
  const auto kernel =
      op.typed<void(at::TensorList, at::TensorList, at::TensorList, double, double, double, double, bool, bool, bool,
                    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&)>();
  auto call = [&](const std::vector<torch::Tensor>& ps, const std::vector<torch::Tensor>& buffers, bool first) {
    if (ps.empty()) return;
    std::vector<torch::Tensor> grads;
    for (const auto& p : ps) grads.push_back(p.grad());
    kernel.call(ps, grads, buffers, h.weight_decay, h.momentum, h.lr, h.dampening, h.nesterov, /*maximize=*/false,
                first, c10::nullopt, c10::nullopt);
  };
  if (h.momentum == 0) return call(params, {}, false);
  std::vector<torch::Tensor> continued, continued_buffers, first, first_buffers;
  for (const auto& p : params) {
    if (auto* state = detail::param_state_of<torch::optim::SGDParamState>(self, p)) {
      continued.push_back(p);
      continued_buffers.push_back(state->momentum_buffer());
    } else {
      auto made = std::make_unique<torch::optim::SGDParamState>();
      made->momentum_buffer(torch::empty_like(p.grad()));
      first.push_back(p);
      first_buffers.push_back(made->momentum_buffer());
      detail::compat::set_optimizer_param_state(self, p, std::move(made));
    }
  }
  call(continued, continued_buffers, false);
  call(first, first_buffers, true);
}

}  // namespace

SGD::SGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, torch::optim::SGDOptions defaults,
         StepKernels kernels)
    : torch::optim::SGD(param_groups, std::move(defaults)), kernels_(kernels) {
  detail::check_step_kernels(kernels_, "fulgor::SGD");
}

SGD::SGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults, StepKernels kernels)
    : SGD({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults), kernels) {}

torch::Tensor SGD::step(LossClosure closure) {
  if (!kernels_.fused && !detail::takes_foreach(kernels_, param_groups())) return torch::optim::SGD::step(closure);
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const SgdHyper h{o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov()};
    for (const auto& bucket : detail::with_grads_by_device_and_dtype(group.params())) {
      if (kernels_.fused)
        fused_sgd(*this, bucket, h, detail::fused_kernel("aten::_fused_sgd_", "fulgor::SGD", bucket));
      else
        foreach_sgd(*this, bucket, h);
    }
  }
  return loss;
}

}  // namespace fulgor
