#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "fulgor/optim/zero_grad.h"

namespace fulgor {

namespace detail {
// What manual optimization asks of the Trainer fitting the module
// (src/loops/manual_optimization.h implements it).
class ManualSteps {
 public:
  virtual void backward(const torch::Tensor& loss) = 0;
  virtual torch::Tensor step(torch::optim::Optimizer& optimizer,
                             const torch::optim::Optimizer::LossClosure& closure) = 0;

 protected:
  ~ManualSteps() = default;
};
}  // namespace detail

/// One of the optimizers configure_optimizers returned, as ModuleBase::optimizers()
/// hands it to a module that optimizes manually (Lightning's LightningOptimizer).
///
///   auto& opt = optimizers()[0];
///   opt.zero_grad();
///   manual_backward(loss);
///   opt.step();
///
/// Contract: step() runs, in Lightning's order, the closure when given, the
/// callbacks' and the module's on_before_optimizer_step (after unscaling the
/// gradients under "16-mixed") and the optimizer's step (through the
/// "16-mixed" loss scaler, which may skip it), and counts one global step
/// whether or not the scaler skipped it. Without a loss scaler the closure
/// goes to the optimizer's own step, so optimizers that evaluate it several
/// times (LBFGS) do; under "16-mixed" it runs once, before the step. step()
/// throws Error unless the module optimizes manually. Valid while the fit
/// that made it runs.
class ManualOptimizer {
 public:
  ManualOptimizer(detail::ManualSteps& steps, torch::optim::Optimizer& optimizer)
      : steps_(&steps), optimizer_(&optimizer) {}

  torch::optim::Optimizer& optimizer() const { return *optimizer_; }
  /// Sets the gradients to none (fulgor::zero_grad), with no hook (as
  /// Lightning's).
  void zero_grad(bool set_to_none = true) { fulgor::zero_grad(*optimizer_, set_to_none); }
  /// Steps the optimizer; returns the closure's last result (undefined without one).
  torch::Tensor step(const torch::optim::Optimizer::LossClosure& closure = nullptr) {
    return steps_->step(*optimizer_, closure);
  }

 private:
  detail::ManualSteps* steps_;
  torch::optim::Optimizer* optimizer_;
};

}  // namespace fulgor
