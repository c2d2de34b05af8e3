// Accelerators that break the Accelerator contract on purpose, so that the
// conformance suite's tests can show it catches them.
#include "fulgor/core/device_guard_accelerator.h"
#include "fulgor/core/registry.h"

namespace {

// Runs on the XPU device type (the emulated runtime FULGOR_XPU_LIBRARY names)
// but moves only a module's parameters, leaving its buffers on the CPU.
class LeakyBuffersAccelerator final : public fulgor::DeviceGuardAccelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kXPU; }
  std::string description() const override { return "leaves module buffers on the CPU"; }
  std::string distributed_backend() const override { return "gloo"; }

  void move_module(torch::nn::Module& module, torch::Device device) const override {
    torch::NoGradGuard no_grad;
    for (auto& parameter : module.parameters()) parameter.set_data(parameter.to(device));
  }

 protected:
  std::string prepare_runtime() const override { return load_runtime_library("FULGOR_XPU_LIBRARY", ""); }
};

// Counts three devices but parses `devices` as if there were two.
class MiscountingAccelerator final : public fulgor::Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "device_count disagrees with parse_devices"; }
  fulgor::Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 3; }
  std::vector<torch::Device> parse_devices(const fulgor::Devices& devices) const override {
    auto indices = fulgor::parse_device_indices(devices, 2, name());
    return std::vector<torch::Device>(indices.size(), torch::Device(torch::kCPU));
  }
  void synchronize(torch::Device) const override {}
  std::string distributed_backend() const override { return "gloo"; }
};

}  // namespace

REGISTER_ACCELERATOR("leaky_buffers", LeakyBuffersAccelerator);
REGISTER_ACCELERATOR("miscounting", MiscountingAccelerator);
