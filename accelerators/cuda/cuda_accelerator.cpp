// NVIDIA GPUs through LibTorch's CUDA support. On a LibTorch built without
// CUDA no device guard exists for it and the accelerator says so.
// FULGOR_WITH_CUDA (set by CMake where LibTorch has CUDA) adds the memory
// statistics of LibTorch's CUDA caching allocator.

#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include <string_view>

#ifdef FULGOR_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "fulgor/core/device_guard_accelerator.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

class CudaAccelerator final : public DeviceGuardAccelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCUDA; }
  std::string description() const override { return "NVIDIA GPUs through LibTorch's CUDA backend"; }
  int priority() const override { return 400; }
  std::string distributed_backend() const override { return "nccl"; }
  bool supports_pinned_memory() const override { return true; }
  // torch.backends.cudnn.benchmark, which Lightning's `benchmark` sets: a
  // flag of LibTorch's global context, there with or without CUDA built in.
  bool set_benchmark(bool enabled) const override {
    at::globalContext().setBenchmarkCuDNN(enabled);
    return true;
  }
  std::vector<std::string> supported_precisions() const override {
    return precisions_with({torch::kHalf, torch::kBFloat16});
  }

  torch::Tensor move_tensor(const torch::Tensor& tensor, torch::Device device, bool non_blocking) const override {
    // Asynchronous host-to-device copies need pinned host memory.
    if (non_blocking && tensor.device().is_cpu() && !tensor.is_pinned()) return tensor.pin_memory().to(device, true);
    return tensor.to(device, non_blocking);
  }

#ifdef FULGOR_WITH_CUDA
  // Lightning's is_oom_error: besides the allocator's OutOfMemoryError, the
  // messages CUDA and cuDNN report a full device with.
  bool is_out_of_memory(const std::exception& error) const override {
    const std::string_view what = error.what();
    const auto has = [&](std::string_view text) { return what.find(text) != std::string_view::npos; };
    return DeviceGuardAccelerator::is_out_of_memory(error) || (has("CUDA") && has("out of memory")) ||
           has("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.");
  }
  // The figures of torch.cuda.memory_stats under its names, over all pools.
  std::map<std::string, int64_t> memory_stats(torch::Device device) const override {
    require_available();
    const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    constexpr size_t kAllPools = 0;  // StatType::AGGREGATE
    std::map<std::string, int64_t> result;
    auto add = [&](const char* name, const auto& stat) {
      result[fmt::format("{}.all.current", name)] = stat[kAllPools].current;
      result[fmt::format("{}.all.peak", name)] = stat[kAllPools].peak;
    };
    add("allocated_bytes", stats.allocated_bytes);
    add("reserved_bytes", stats.reserved_bytes);
    add("active_bytes", stats.active_bytes);
    add("inactive_split_bytes", stats.inactive_split_bytes);
    result["num_alloc_retries"] = stats.num_alloc_retries;
    result["num_ooms"] = stats.num_ooms;
    return result;
  }
#endif

 protected:
  std::string prepare_runtime() const override {
    if (!c10::impl::hasDeviceGuardImpl(torch::kCUDA)) return "this LibTorch was built without CUDA";
    if (!at::hasCUDA()) return "LibTorch has CUDA but finds no CUDA driver or device";
    return {};
  }
};

}  // namespace
}  // namespace fulgor

REGISTER_ACCELERATOR("cuda", fulgor::CudaAccelerator);
