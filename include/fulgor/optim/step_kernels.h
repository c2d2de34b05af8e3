#pragma once

#include "fulgor/core/export.h"

#include <optional>

namespace torch::optim {
class Optimizer;
}

namespace fulgor {

/// How fulgor::Adam, AdamW and SGD compute a step: torch.optim's `foreach`
/// and `fused` arguments (Note [Foreach and fused steps] in
/// src/optim/step_kernels.cpp).
///
/// - neither: LibTorch's torch::optim step, a dozen small operations per
///   parameter;
/// - foreach: the same arithmetic over all parameters of a device and dtype at
///   once, with the _foreach_* operations (a few kernels a step on a GPU);
/// - fused: one kernel per device and dtype (at::_fused_adam_, _fused_adamw_,
///   _fused_sgd_), where this LibTorch has one for the parameters' device.
///
/// Contract: `foreach` unset takes the foreach path unless a parameter is on
/// the CPU, as torch.optim's default does; fused and foreach both true is
/// refused, as torch.optim refuses it. A fused step on a device this LibTorch
/// has no kernel for throws a DeviceError naming both.
struct StepKernels {
  std::optional<bool> foreach;
  bool fused = false;
};

/// The kernels of a fulgor::Adam, AdamW or SGD; nullptr for any other
/// optimizer (LibTorch's own step each parameter alone).
FULGOR_API const StepKernels* step_kernels_of(const torch::optim::Optimizer& optimizer);

}  // namespace fulgor
