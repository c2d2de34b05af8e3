#pragma once

// An accelerator for the workers that check the loss scaler of "16-mixed"
// across ranks.

#include <memory>
#include <string>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/devices.h"
#include "fulgor/core/registry.h"

namespace fulgor::test {

/// The CPU, claiming "16-mixed" so that the Trainer and Fabric scale the
/// loss, with the autocast of a device it holds no tensor on: LibTorch 1.13
/// has no float16 autocast on the CPU, and the workers compute in float64,
/// which autocast leaves alone anyway. What runs is the loss scaler's path.
class Fp16ScalingCpu final : public fulgor::Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  torch::DeviceType autocast_device_type() const override { return torch::kCUDA; }
  std::string description() const override { return "the CPU, scaling the loss of 16-mixed"; }
  int priority() const override { return -1; }
  fulgor::Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 1; }
  std::vector<torch::Device> parse_devices(const fulgor::Devices& devices) const override {
    return std::vector<torch::Device>(static_cast<size_t>(fulgor::parse_process_count(devices, name())),
                                      torch::Device(torch::kCPU));
  }
  std::string distributed_backend() const override { return "gloo"; }
  std::vector<std::string> supported_precisions() const override { return {"32-true", "16-mixed"}; }
};

/// Registers Fp16ScalingCpu as "fp16_scaling_cpu".
inline void register_fp16_scaling_cpu() {
  fulgor::RegisterOptions replace;
  replace.override = true;
  fulgor::AcceleratorRegistry::instance().add(
      "fp16_scaling_cpu", [] { return std::make_unique<Fp16ScalingCpu>(); }, replace);
}

/// Where a spiked loss is infinite under the loss scale: at the second batch
/// of rank 1.
constexpr double kSpike = 1e308;

}  // namespace fulgor::test
