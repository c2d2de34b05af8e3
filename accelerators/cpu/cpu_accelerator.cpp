// The CPU: always available. Its `devices` value is a number of processes,
// all on the one CPU device, as in PyTorch Lightning.

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <string_view>

#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fulgor/core/runtime_info.h"

namespace fulgor {
namespace {

class CpuAccelerator final : public Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "the host CPU, through LibTorch's CPU kernels"; }
  int priority() const override { return 0; }
  Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 1; }
  int64_t auto_device_count() const override { return 1; }

  std::vector<torch::Device> parse_devices(const Devices& devices) const override {
    return std::vector<torch::Device>(static_cast<size_t>(parse_process_count(devices, name())),
                                      torch::Device(torch::kCPU));
  }

  // Note [BLAS threads] in src/core/runtime_info.cpp.
  void setup_device(const DeviceSetup&) override { limit_blas_threads(); }
  void synchronize(torch::Device) const override {}
  std::string distributed_backend() const override { return "gloo"; }
  std::vector<std::string> supported_precisions() const override { return precisions_with({torch::kBFloat16}); }

  // The process's resident and virtual memory, as the CPU has no allocator of its own to ask.
  // LibTorch's CPU allocator reports a failed allocation as a plain c10::Error.
  bool is_out_of_memory(const std::exception& error) const override {
    return Accelerator::is_out_of_memory(error) ||
           std::string_view(error.what()).find("DefaultCPUAllocator: can't allocate memory") != std::string_view::npos;
  }
  std::map<std::string, int64_t> memory_stats(torch::Device) const override {
    std::ifstream statm("/proc/self/statm");
    int64_t virtual_pages = 0, resident_pages = 0;
    if (!(statm >> virtual_pages >> resident_pages)) return {};
    const int64_t page = sysconf(_SC_PAGESIZE);
    return {{"process_resident_bytes", resident_pages * page}, {"process_virtual_bytes", virtual_pages * page}};
  }
};

}  // namespace
}  // namespace fulgor

REGISTER_ACCELERATOR("cpu", fulgor::CpuAccelerator);
