#pragma once

#include <string>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// A base for accelerators whose devices LibTorch already knows through a
/// registered device guard (c10::impl::DeviceGuardImplInterface), which is how
/// every vendor runtime plugs into LibTorch. It answers availability and the
/// device count from that guard, once prepare_runtime() has run.
///
/// Subclasses give name, device type, description, priority and distributed
/// backend; they override prepare_runtime() to load or check a vendor runtime.
///
/// The runtime is prepared by whichever comes first: an availability check or
/// a method that reaches the device (setup_device, move_tensor and so
/// move_module and move_batch, get_rng_state, set_rng_state). Those throw
/// DeviceError with the reason when the accelerator is unavailable.
class FULGOR_API DeviceGuardAccelerator : public Accelerator {
 public:
  Availability availability() const override;
  int64_t device_count() const override;
  void setup_device(const DeviceSetup& setup) override;
  torch::Tensor move_tensor(const torch::Tensor& tensor, torch::Device device, bool non_blocking) const override;
  torch::Tensor get_rng_state(torch::Device device) const override;
  void set_rng_state(torch::Device device, const torch::Tensor& state) const override;

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

  /// Prepares the runtime; throws DeviceError with the reason when unavailable.
  /// Cheap once it has succeeded: a loaded runtime stays loaded.
  void require_available() const;

 private:
  mutable bool ready_ = false;  // require_available() succeeded; moves sit on the hot path
};

}  // namespace fulgor
