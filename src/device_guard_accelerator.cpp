#include "fulgor/device_guard_accelerator.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <mutex>

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

void DeviceGuardAccelerator::setup_device(torch::Device device) {
  c10::impl::getDeviceGuardImpl(device_type())->setDevice(device);
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
