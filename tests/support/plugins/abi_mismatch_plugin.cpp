// A plugin as if compiled against fulgor headers of another plugin ABI version.
#include "fulgor/core/registry.h"

namespace {
class FutureAccelerator final : public fulgor::Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "built for another ABI"; }
  fulgor::Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 1; }
  std::string distributed_backend() const override { return "gloo"; }
};
}  // namespace

FULGOR_DETAIL_REGISTER_ACCELERATOR(FULGOR_PLUGIN_ABI_VERSION + 998, "future", FutureAccelerator);
