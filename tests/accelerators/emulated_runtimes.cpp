#include "emulated_runtimes.h"

#include <cstdlib>
#include <string>

namespace fulgor::testing {
namespace {

// The built-in xpu and npu accelerators load the runtime library these
// variables name the first time availability is asked, as they would load a
// vendor's; the emulated runtimes read their device count when loaded. Set
// before main, so the tests run the same under ctest and by hand; a caller's
// own values win. Three devices, not the default two, shows the count is read.
const bool environment_set = [] {
  setenv("FULGOR_XPU_LIBRARY", FULGOR_EMULATED_XPU_LIBRARY, /*overwrite=*/0);
  // Empty where this LibTorch cannot have the emulated npu; the npu tests skip.
  if (std::string(FULGOR_EMULATED_NPU_LIBRARY).size() > 0)
    setenv("FULGOR_NPU_LIBRARY", FULGOR_EMULATED_NPU_LIBRARY, /*overwrite=*/0);
  setenv("FULGOR_EMULATED_DEVICE_COUNT", "3", /*overwrite=*/0);
  return true;
}();

}  // namespace

int64_t emulated_device_count() { return std::stoll(std::getenv("FULGOR_EMULATED_DEVICE_COUNT")); }

torch::nn::Sequential mlp_with_buffers() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                               torch::nn::Linear(8, 2));
}

std::vector<torch::Tensor> parameters_and_buffers(torch::nn::Module& module) {
  std::vector<torch::Tensor> tensors = module.parameters();
  for (const torch::Tensor& buffer : module.buffers()) tensors.push_back(buffer);
  return tensors;
}

}  // namespace fulgor::testing
