#pragma once

// What the xpu and npu accelerator tests share: the emulated runtimes they run
// on (see emulated_runtimes.cpp) and a module with buffers to move.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace fulgor::testing {

/// The emulated devices the tests name.
inline const torch::Device kXpu1(torch::kXPU, 1);
inline const torch::Device kNpu0(torch::DeviceType::PrivateUse1, 0);
inline const torch::Device kNpu1(torch::DeviceType::PrivateUse1, 1);

/// The number of devices each emulated runtime has in this process.
int64_t emulated_device_count();

/// An MLP with a BatchNorm, so that it has buffers as well as parameters.
torch::nn::Sequential mlp_with_buffers();

/// Every parameter and buffer of `module`.
std::vector<torch::Tensor> parameters_and_buffers(torch::nn::Module& module);

}  // namespace fulgor::testing
