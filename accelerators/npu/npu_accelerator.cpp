// Huawei Ascend NPUs. Ascend's torch_npu registers LibTorch's PrivateUse1
// device type under the name "npu" (LibTorch 2.1 and later). When no backend
// has claimed PrivateUse1 yet, the runtime library is loaded first: the one
// FULGOR_NPU_LIBRARY names, by default libtorch_npu.so from the loader's path.

#include <fmt/format.h>

#include "fulgor/detail/compat.h"
#include "fulgor/core/device_guard_accelerator.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

class NpuAccelerator final : public DeviceGuardAccelerator {
 public:
  torch::DeviceType device_type() const override { return torch::DeviceType::PrivateUse1; }
  std::string description() const override { return "Ascend NPUs through LibTorch's PrivateUse1 device type"; }
  int priority() const override { return 200; }
  std::string distributed_backend() const override { return "hccl"; }
  std::vector<std::string> supported_precisions() const override {
    return precisions_with({torch::kHalf, torch::kBFloat16});
  }

 protected:
  std::string prepare_runtime() const override {
    if (!detail::compat::kHasNamedPrivateUse1)
      return fmt::format("Ascend NPUs need LibTorch 2.1 or later to name the PrivateUse1 device; this is {}",
                         TORCH_VERSION);
    if (detail::compat::privateuse1_backend_name().empty()) {
      std::string error = load_runtime_library("FULGOR_NPU_LIBRARY", "libtorch_npu.so");
      if (!error.empty()) return error;
    }
    const std::string backend = detail::compat::privateuse1_backend_name();
    if (backend != "npu")
      return backend.empty() ? std::string("the NPU runtime loaded but registered no PrivateUse1 backend")
                             : fmt::format("the PrivateUse1 device type belongs to '{}', not 'npu'", backend);
    return {};
  }
};

}  // namespace
}  // namespace fulgor

REGISTER_ACCELERATOR("npu", fulgor::NpuAccelerator);
