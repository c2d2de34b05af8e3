#pragma once

#include <string>

#include "fulgor/accelerator.h"

namespace fulgor {

/// A base for accelerators whose devices LibTorch already knows through a
/// registered device guard (c10::impl::DeviceGuardImplInterface), which is how
/// every vendor runtime plugs into LibTorch. It answers availability and the
/// device count from that guard, once prepare_runtime() has run.
///
/// Subclasses give name, device type, description, priority and distributed
/// backend; they override prepare_runtime() to load or check a vendor runtime.
class DeviceGuardAccelerator : public Accelerator {
 public:
  Availability availability() const override;
  int64_t device_count() const override;
  void setup_device(torch::Device device) override;

 protected:
  /// Makes the vendor runtime usable (for example, loads its library). Returns
  /// an empty string on success or the reason the runtime is unusable. Called
  /// before every availability check, so it must be cheap after the first call.
  virtual std::string prepare_runtime() const { return {}; }

  /// Loads the shared library named by environment variable `env_var` (or
  /// `default_library` when that is unset; nothing when both are empty) into
  /// the process with global symbols, once per path. Returns "" on success or
  /// the loader's error naming the file and the variable.
  static std::string load_runtime_library(const char* env_var, const std::string& default_library);
};

}  // namespace fulgor
