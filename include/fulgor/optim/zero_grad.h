#pragma once

#include <torch/optim/optimizer.h>

namespace fulgor {

/// PyTorch 2's optimizer.zero_grad(set_to_none=True), on every LibTorch:
/// 1.13's Optimizer::zero_grad() only zeroes. Set to none, a gradient is
/// written afresh by the next backward instead of added to zeros (one pass
/// over every gradient less per step), and a parameter that the next pass
/// does not reach is not stepped (an optimizer skips a parameter with no
/// gradient; a zero gradient would still move it under momentum or weight
/// decay). `set_to_none = false` zeroes them in place, detached, as
/// LibTorch does.
///
/// The Trainer (Module::optimizer_zero_grad), manual optimization
/// (ManualOptimizer::zero_grad), Fabric (FabricOptimizer::zero_grad) and
/// the C API all clear gradients through this.
inline void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none = true) {
  for (auto& group : optimizer.param_groups())
    for (auto& param : group.params()) {
      torch::Tensor& grad = param.mutable_grad();
      if (!grad.defined()) continue;
      if (set_to_none) {
        grad.reset();
      } else {
        grad.detach_();
        grad.zero_();
      }
    }
}

}  // namespace fulgor
