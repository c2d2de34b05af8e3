#pragma once

// An accelerator for the tests of "16-mixed" on a machine without a GPU.

#include <memory>
#include <string>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/devices.h"
#include "fulgor/core/registry.h"

namespace fulgor::test {

/// The CPU, claiming "16-mixed" (and "bf16-mixed") so that the Trainer and
/// Fabric scale the loss. `autocast`: the device whose autocast the mixed
/// precisions enter. The CPU's own, where float16 autocast runs (LibTorch
/// 2.x); another, that it holds no tensor on, where only the loss scaler's
/// path is to run (LibTorch 1.13 has no float16 autocast on the CPU).
class Fp16Cpu final : public fulgor::Accelerator {
 public:
  explicit Fp16Cpu(torch::DeviceType autocast) : autocast_(autocast) {}
  torch::DeviceType device_type() const override { return torch::kCPU; }
  torch::DeviceType autocast_device_type() const override { return autocast_; }
  std::string description() const override { return "the CPU, claiming 16-mixed for the tests"; }
  int priority() const override { return -1; }
  fulgor::Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 1; }
  std::vector<torch::Device> parse_devices(const fulgor::Devices& devices) const override {
    return std::vector<torch::Device>(static_cast<size_t>(fulgor::parse_process_count(devices, name())),
                                      torch::Device(torch::kCPU));
  }
  std::string distributed_backend() const override { return "gloo"; }
  std::vector<std::string> supported_precisions() const override { return {"32-true", "16-mixed", "bf16-mixed"}; }

 private:
  torch::DeviceType autocast_;
};

/// Registers Fp16Cpu with `autocast` as `name`.
inline void register_fp16_cpu(const std::string& name, torch::DeviceType autocast) {
  fulgor::RegisterOptions replace;
  replace.override = true;
  fulgor::AcceleratorRegistry::instance().add(
      name, [autocast] { return std::make_unique<Fp16Cpu>(autocast); }, replace);
}

/// The accelerator of the workers that check the loss scaler across ranks:
/// they compute in float64, which autocast leaves alone anyway.
inline void register_fp16_scaling_cpu() { register_fp16_cpu("fp16_scaling_cpu", torch::kCUDA); }

/// Where a spiked loss is infinite under the loss scale: at the second batch
/// of rank 1.
constexpr double kSpike = 1e308;

}  // namespace fulgor::test
