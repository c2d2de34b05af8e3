// A plugin that claims a name the built-ins already use, next to a new one:
// neither may end up registered.
#include "fulgor/core/registry.h"

namespace {
class ImpostorAccelerator final : public fulgor::Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "claims a taken name"; }
  fulgor::Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 1; }
  std::string distributed_backend() const override { return "gloo"; }
};
class InnocentAccelerator final : public fulgor::Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "registered beside a clash"; }
  fulgor::Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 1; }
  std::string distributed_backend() const override { return "gloo"; }
};
}  // namespace

REGISTER_ACCELERATOR("innocent", InnocentAccelerator);
REGISTER_ACCELERATOR("cpu", ImpostorAccelerator);
