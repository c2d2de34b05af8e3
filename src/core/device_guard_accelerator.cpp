#include "fulgor/core/device_guard_accelerator.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "fulgor/core/error.h"

namespace fulgor {

Availability DeviceGuardAccelerator::availability() const {
  std::string problem = prepare_runtime();
  if (!problem.empty()) return {false, problem};
  if (!c10::impl::hasDeviceGuardImpl(device_type()))
    return {false, fmt::format("LibTorch has no {} support in this process (no device guard is registered for it)",
                               c10::DeviceTypeName(device_type(), /*lower_case=*/true))};
  if (c10::impl::getDeviceGuardImpl(device_type())->deviceCount() <= 0)
    return {false, fmt::format("the {} runtime is loaded but reports no devices", name())};
  return {true, {}};
}

int64_t DeviceGuardAccelerator::device_count() const {
  if (!availability().available) return 0;
  return c10::impl::getDeviceGuardImpl(device_type())->deviceCount();
}

// Note [Preparing the runtime on first use]
// A vendor runtime registers the device type with LibTorch when its library
// is loaded, which prepare_runtime() does. Until then LibTorch cannot even
// allocate on the device, and fails with messages that blame the LibTorch
// build. So every method that reaches the device prepares the runtime first,
// rather than relying on the caller to have asked about availability.
void DeviceGuardAccelerator::require_available() const {
  if (ready_) return;
  const Availability a = availability();
  if (!a.available) throw DeviceError(fmt::format("accelerator '{}' is not available: {}", name(), a.reason));
  ready_ = true;
}

void DeviceGuardAccelerator::setup_device(const DeviceSetup& setup) {
  require_available();
  c10::impl::getDeviceGuardImpl(device_type())->setDevice(setup.device);
}

torch::Tensor DeviceGuardAccelerator::move_tensor(const torch::Tensor& tensor, torch::Device device,
                                                  bool non_blocking) const {
  require_available();
  return Accelerator::move_tensor(tensor, device, non_blocking);
}

torch::Tensor DeviceGuardAccelerator::get_rng_state(torch::Device device) const {
  require_available();
  return Accelerator::get_rng_state(device);
}

void DeviceGuardAccelerator::set_rng_state(torch::Device device, const torch::Tensor& state) const {
  require_available();
  Accelerator::set_rng_state(device, state);
}

std::string DeviceGuardAccelerator::load_runtime_library(const char* env_var, const std::string& default_library) {
  const char* from_env = std::getenv(env_var);
  const std::string path = from_env != nullptr ? from_env : default_library;
  if (path.empty()) return {};
  // dlopen is reference counted and runs initialisers once; remembering the
  // outcome keeps repeated availability checks cheap and their answer stable.
  static std::mutex mutex;
  static auto* outcomes = new std::map<std::string, std::string>();
  std::lock_guard<std::mutex> lock(mutex);
  auto known = outcomes->find(path);
  if (known != outcomes->end()) return known->second;
  std::string error;
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    error = fmt::format("cannot load the runtime library '{}' ({}{}): {}", path,
                        from_env != nullptr ? "from " : "default; set ", env_var, why ? why : "unknown error");
  }
  return outcomes->emplace(path, error).first->second;
}

}  // namespace fulgor
