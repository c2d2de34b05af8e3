// A complete accelerator plugin: "vcpu", a number of virtual devices that all
// compute on the host CPU. The device count comes from VCPU_DEVICE_COUNT
// (default 2), so multi-device code paths can be tried on any machine.
//
// Its devices are chosen by index like GPUs ("0,1", 2, "auto"), and each of
// them is LibTorch's one CPU device, which the defaults of fulgor::Accelerator
// give for a CPU-backed accelerator. A real backend replaces the device type
// and the answers below with its runtime's; everything else in fulgor then
// works with it unchanged.

#include <fulgor/fulgor.h>

#include <cstdlib>
#include <string>

namespace {

class VcpuAccelerator final : public fulgor::Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "virtual devices on the host CPU (VCPU_DEVICE_COUNT)"; }
  // Below the CPU's 0: "auto" keeps choosing the plain CPU.
  int priority() const override { return -10; }

  fulgor::Availability availability() const override {
    if (device_count() < 1) return {false, "VCPU_DEVICE_COUNT is not a positive number"};
    return {true, {}};
  }

  int64_t device_count() const override {
    const char* env = std::getenv("VCPU_DEVICE_COUNT");
    if (env == nullptr) return 2;
    char* end = nullptr;
    long count = std::strtol(env, &end, 10);
    return (end != env && *end == '\0' && count > 0) ? count : 0;
  }

  std::string distributed_backend() const override { return "gloo"; }
  std::vector<std::string> supported_precisions() const override { return precisions_with({torch::kBFloat16}); }
};

}  // namespace

REGISTER_ACCELERATOR("vcpu", VcpuAccelerator);
