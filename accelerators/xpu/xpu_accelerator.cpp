// Intel GPUs. LibTorch 2.4 and later carry XPU support natively; before that
// Intel's extension registers the XPU device guard. Either way the vendor
// runtime may be a library to load first, named by FULGOR_XPU_LIBRARY.

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "fulgor/core/device_guard_accelerator.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

class XpuAccelerator final : public DeviceGuardAccelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kXPU; }
  std::string description() const override { return "Intel GPUs through LibTorch's XPU device type"; }
  int priority() const override { return 300; }
  std::string distributed_backend() const override { return "xccl"; }
  std::vector<std::string> supported_precisions() const override {
    return precisions_with({torch::kHalf, torch::kBFloat16});
  }

 protected:
  std::string prepare_runtime() const override {
    std::string error = load_runtime_library("FULGOR_XPU_LIBRARY", "");
    if (error.empty() && !c10::impl::hasDeviceGuardImpl(torch::kXPU))
      return "no XPU runtime: this LibTorch has no XPU support built in and FULGOR_XPU_LIBRARY names no runtime "
             "library that adds it";
    return error;
  }
};

}  // namespace
}  // namespace fulgor

REGISTER_ACCELERATOR("xpu", fulgor::XpuAccelerator);
