#pragma once

// What fulgor's Adam, AdamW and SGD share (Note [Foreach and fused steps] in
// src/optim/step_kernels.cpp).

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "fulgor/detail/compat.h"
#include "fulgor/optim/step_kernels.h"

namespace fulgor::detail {

/// Refuses fused and foreach together, as torch.optim does.
void check_step_kernels(const StepKernels& kernels, const char* optimizer);

/// Whether a step over `groups` takes the foreach path.
bool takes_foreach(const StepKernels& kernels, const std::vector<torch::optim::OptimizerParamGroup>& groups);

/// The parameters of a group that have a gradient, split by device and dtype
/// as torch.optim's _group_tensors_by_device_and_dtype splits them: a
/// _foreach_ operation or a fused kernel takes tensors of one device and dtype.
std::vector<std::vector<torch::Tensor>> with_grads_by_device_and_dtype(const std::vector<torch::Tensor>& params);

/// The fused kernel `name` ("aten::_fused_adam_") for the device of `params`;
/// a DeviceError naming the LibTorch version and the device where it has none.
c10::OperatorHandle fused_kernel(const char* name, const char* optimizer, const std::vector<torch::Tensor>& params);

/// The state of `param` as the optimizer's ParamState type; nullptr before its first step.
template <typename ParamState>
ParamState* param_state_of(const torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  return static_cast<ParamState*>(compat::optimizer_param_state(optimizer, param));
}

/// The fused Adam kernels read each parameter's step count from a float32
/// scalar on its device, as torch.optim keeps it. The optimizer's state keeps
/// the count as LibTorch's int64; these tensors follow it, and one whose count
/// moved without it (a load of the state) or whose parameter moved to another
/// device is made anew.
class FusedStepCounts {
 public:
  /// The counts of `params`, which have taken `steps` steps each, increased by
  /// one on their devices (the step about to be taken).
  std::vector<torch::Tensor> advance(const std::vector<torch::Tensor>& params, const std::vector<int64_t>& steps);

 private:
  struct Count {
    int64_t steps;
    torch::Tensor value;
  };
  std::unordered_map<const c10::TensorImpl*, Count> counts_;
};

}  // namespace fulgor::detail
