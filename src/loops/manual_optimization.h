#pragma once

// Manual optimization (Lightning's _ManualOptimization loop and the parts of
// its strategy and precision plugin that manual_backward and
// LightningOptimizer.step reach): what a module that optimizes in its own
// training_step calls back into.

#include <torch/types.h>

#include "fulgor/optim/manual_optimizer.h"
#include "fulgor/module.h"

namespace fulgor::detail {

struct LoopContext;

class ManualOptimization final : public ManualSteps {
 public:
  explicit ManualOptimization(LoopContext& state) : s(state) {}

  // Hands the module its ManualOptimizers for the fit beginning (and takes
  // them back with `attach = false`).
  void attach(ModuleBase& module, bool attach);
  // Lightning's __verify_manual_optimization_support and the checks of
  // _init_optimizers_and_lr_schedulers that depend on the mode.
  void check(const ModuleBase& module) const;

  void backward(const torch::Tensor& loss) override;
  torch::Tensor step(torch::optim::Optimizer& optimizer, const torch::optim::Optimizer::LossClosure& closure) override;

 private:
  void before_optimizer_step(torch::optim::Optimizer& optimizer);

  LoopContext& s;
};

}  // namespace fulgor::detail
