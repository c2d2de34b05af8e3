#pragma once

// The foreach and fused steps of fulgor::Adam and AdamW, which differ only in
// their options' and state's types and in where the weight decay goes
// (Note [Foreach and fused steps] in src/optim/step_kernels.cpp).

#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "optim/grouped_step.h"

namespace fulgor::detail {

// One device's and dtype's share of a param group.
struct AdamLists {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<int64_t> steps;  // before this step
};

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, decoupled;
};

// torch.optim's _multi_tensor_adam and _multi_tensor_adamw, with LibTorch's
// arithmetic (torch/csrc/api/src/optim/adam.cpp, adamw.cpp).
inline void foreach_adam(AdamLists& l, const AdamHyper& h) {
  std::vector<c10::Scalar> denom_scale, step_size;
  for (const int64_t before : l.steps) {
    const auto step = static_cast<double>(before + 1);
    denom_scale.emplace_back(std::sqrt(1 - std::pow(h.beta2, step)));
    step_size.emplace_back(-h.lr / (1 - std::pow(h.beta1, step)));
  }
  std::vector<torch::Tensor> grads = l.grads;
  if (h.weight_decay != 0) {
    if (h.decoupled)
      torch::_foreach_mul_(l.params, 1 - h.lr * h.weight_decay);
    else
      grads = torch::_foreach_add(grads, l.params, h.weight_decay);
  }
  torch::_foreach_mul_(l.exp_avgs, h.beta1);
  torch::_foreach_add_(l.exp_avgs, grads, 1 - h.beta1);
  torch::_foreach_mul_(l.exp_avg_sqs, h.beta2);
  torch::_foreach_addcmul_(l.exp_avg_sqs, grads, grads, 1 - h.beta2);
  if (h.amsgrad) torch::_foreach_maximum_(l.max_exp_avg_sqs, l.exp_avg_sqs);
  std::vector<torch::Tensor> denom = torch::_foreach_sqrt(h.amsgrad ? l.max_exp_avg_sqs : l.exp_avg_sqs);
  torch::_foreach_div_(denom, denom_scale);
  torch::_foreach_add_(denom, h.eps);
  torch::_foreach_addcdiv_(l.params, l.exp_avgs, denom, step_size);
}

// torch.optim's _fused_adam and _fused_adamw: one kernel for the lists.
inline void fused_adam(AdamLists& l, const AdamHyper& h, const c10::OperatorHandle& op, FusedStepCounts& counts) {
  const auto kernel = op.typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                    at::TensorList, double, double, double, double, double, bool, bool,
                                    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&)>();
  const std::vector<torch::Tensor> steps = counts.advance(l.params, l.steps);
  kernel.call(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, steps, h.lr, h.beta1, h.beta2,
              h.weight_decay, h.eps, h.amsgrad, /*maximize=*/false, c10::nullopt, c10::nullopt);
}

// A foreach or fused step of an Adam (ParamState, Options: AdamParamState,
// AdamOptions) or AdamW optimizer. The state is made as LibTorch's step makes
// it, on a parameter's first step.
template <typename ParamState, typename Options>
torch::Tensor grouped_adam_step(torch::optim::Optimizer& self, const torch::optim::Optimizer::LossClosure& closure,
                                bool fused, bool decoupled, FusedStepCounts& counts, const char* optimizer) {
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  for (auto& group : self.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    const AdamHyper h{o.lr(),   std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.amsgrad(),
                      decoupled};
    for (const auto& bucket : with_grads_by_device_and_dtype(group.params())) {
      std::optional<c10::OperatorHandle> kernel;
      if (fused) kernel = fused_kernel(decoupled ? "aten::_fused_adamw_" : "aten::_fused_adam_", optimizer, bucket);
      AdamLists l;
      for (const auto& p : bucket) {
        auto* state = param_state_of<ParamState>(self, p);
        if (!state) {
          auto made = std::make_unique<ParamState>();
          made->step(0);
          made->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          made->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          if (h.amsgrad) made->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          state = made.get();
          compat::set_optimizer_param_state(self, p, std::move(made));
        }
        l.params.push_back(p);
        l.grads.push_back(p.grad());
        l.exp_avgs.push_back(state->exp_avg());
        l.exp_avg_sqs.push_back(state->exp_avg_sq());
        if (h.amsgrad) l.max_exp_avg_sqs.push_back(state->max_exp_avg_sq());
        l.steps.push_back(state->step());
        state->step(state->step() + 1);
      }
      if (fused)
        fused_adam(l, h, *kernel, counts);
      else
        foreach_adam(l, h);
    }
  }
  return loss;
}

}  // namespace fulgor::detail
