#include "fulgor/optim/step_kernels.h"

#include <fmt/format.h>
#include <torch/version.h>

#include <map>
#include <string>
#include <tuple>

#include "fulgor/core/error.h"
#include "fulgor/optim/adam.h"
#include "fulgor/optim/adamw.h"
#include "fulgor/optim/sgd.h"
#include "optim/grouped_step.h"

// Note [Foreach and fused steps]
// LibTorch's torch::optim::Adam, AdamW and SGD step each parameter with a
// dozen small operations: on a GPU, a dozen kernel launches per parameter per
// step, which for a model of small layers costs more than its forward and
// backward. torch.optim offers two other paths (torch/optim/adam.py, sgd.py),
// and fulgor's Adam, AdamW and SGD take them as torch.optim does:
// - foreach (_multi_tensor_adam, _multi_tensor_sgd): the same operations, each
//   over the list of a device's and dtype's parameters at once. The bias
//   corrections come from the step counts, which LibTorch's state keeps on the
//   host, so nothing is read back from the device.
// - fused (_fused_adam, _fused_sgd): one kernel per device and dtype, LibTorch's
//   at::_fused_adam_, _fused_adamw_ and _fused_sgd_, called through the
//   dispatcher: LibTorch 1.13 has only _fused_adam_, for CUDA alone; 2.x has
//   the three, and CPU kernels from 2.4. The kernels read the step counts from
//   float32 tensors on the device, as torch.optim keeps them
//   (FusedStepCounts).
// The state stays LibTorch's (AdamParamState, SGDParamState), so that
// save/load, checkpoints and interop see a torch::optim optimizer. The
// arithmetic follows LibTorch's own step (exp_avg by mul_ and add_, as
// torch.optim 1.13; 2.x's lerp_ differs in the last bit), so the paths agree
// with torch::optim and torch.optim up to the rounding of their order of
// operations.

namespace fulgor {

const StepKernels* step_kernels_of(const torch::optim::Optimizer& optimizer) {
  if (const auto* adam = dynamic_cast<const Adam*>(&optimizer)) return &adam->kernels();
  if (const auto* adamw = dynamic_cast<const AdamW*>(&optimizer)) return &adamw->kernels();
  if (const auto* sgd = dynamic_cast<const SGD*>(&optimizer)) return &sgd->kernels();
  return nullptr;
}

namespace detail {

void check_step_kernels(const StepKernels& kernels, const char* optimizer) {
  if (kernels.fused && kernels.foreach.value_or(false))
    throw ConfigError(
        fmt::format("{}: fused=true and foreach=true together; accepted: one of them, or neither", optimizer));
}

bool takes_foreach(const StepKernels& kernels, const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  if (kernels.fused) return false;
  if (kernels.foreach) return *kernels.foreach;
  // torch.optim's _default_to_fused_or_foreach: foreach where every parameter
  // is on a device with native foreach kernels; on the CPU the _foreach_ ops
  // are a loop over the single-tensor ones.
  for (const auto& group : groups)
    for (const auto& param : group.params())
      if (param.is_cpu()) return false;
  return true;
}

std::vector<std::vector<torch::Tensor>> with_grads_by_device_and_dtype(const std::vector<torch::Tensor>& params) {
  std::map<std::tuple<int, int, int>, std::vector<torch::Tensor>> buckets;
  for (const auto& param : params) {
    if (!param.grad().defined()) continue;
    if (param.grad().is_sparse())
      throw ConfigError("foreach and fused optimizer steps take dense gradients; a parameter's is sparse");
    const auto device = param.device();
    buckets[{static_cast<int>(device.type()), device.index(), static_cast<int>(param.scalar_type())}].push_back(param);
  }
  std::vector<std::vector<torch::Tensor>> out;
  for (auto& [key, bucket] : buckets) out.push_back(std::move(bucket));
  return out;
}

c10::OperatorHandle fused_kernel(const char* name, const char* optimizer, const std::vector<torch::Tensor>& params) {
  const torch::Tensor& first = params.front();
  const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
  const auto key = c10::legacyExtractDispatchKey(first.key_set());
  if (!op || !op->hasKernelForDispatchKey(key))
    throw DeviceError(
        fmt::format("{}: fused=true, but LibTorch {} has no fused kernel ({}) for device {}; "
                    "accepted: a device it has one for, or foreach",
                    optimizer, TORCH_VERSION, name, first.device().str()));
  if (!first.is_floating_point())
    throw ConfigError(fmt::format("{}: fused=true takes floating-point parameters; one is {}", optimizer,
                                  c10::toString(first.scalar_type())));
  return *op;
}

std::vector<torch::Tensor> FusedStepCounts::advance(const std::vector<torch::Tensor>& params,
                                                    const std::vector<int64_t>& steps) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    auto& count = counts_[params[i].unsafeGetTensorImpl()];
    if (!count.value.defined() || count.steps != steps[i] || count.value.device() != params[i].device())
      count = {steps[i], torch::full({}, static_cast<double>(steps[i]),
                                     torch::TensorOptions().dtype(torch::kFloat32).device(params[i].device()))};
    ++count.steps;
    out.push_back(count.value);
  }
  torch::_foreach_add_(out, 1);
  return out;
}

}  // namespace detail
}  // namespace fulgor
