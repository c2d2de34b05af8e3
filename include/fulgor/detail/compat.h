#pragma once

// Note [One LibTorch]
// Every difference between the LibTorch versions fulgor supports (1.13 and
// 2.x) is answered here, so that the rest of the code reads as if there were
// one LibTorch. Add a function here rather than a version check elsewhere.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/types.h>
#include <torch/version.h>

#include <string>
#include <vector>

#define FULGOR_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace fulgor::detail::compat {

/// Whether this LibTorch lets a library name the PrivateUse1 device type and
/// register its hooks (2.1 and later).
constexpr bool kHasNamedPrivateUse1 = FULGOR_TORCH_AT_LEAST(2, 1);

/// The name PrivateUse1 was renamed to, or "" when no backend renamed it (and
/// always "" where renaming does not exist).
std::string privateuse1_backend_name();

/// Whether LibTorch can autocast on `device_type`.
bool autocast_supported(c10::DeviceType device_type);
/// Turns autocast on `device_type` on or off, computing in `dtype`, and
/// returns the previous (enabled, dtype). Requires autocast_supported.
std::pair<bool, c10::ScalarType> set_autocast(c10::DeviceType device_type, bool enabled, c10::ScalarType dtype);
/// Enters or leaves one level of autocast nesting; leaving the outermost
/// level clears the cache of casted weights, as Python's autocast does.
void autocast_enter();
void autocast_exit();

/// GradScaler's two operations, with LibTorch's fused amp kernels where this
/// LibTorch has them for every device type (2.3 and later), else with the
/// same arithmetic in plain tensor operations.
///   unscale: grads *= inv_scale; found_inf = 1 if any grad has inf or NaN.
///   update:  back off and reset the tracker when found_inf, else count a good
///            step and grow the scale every `interval` good steps.
void unscale_grads(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf, const torch::Tensor& inv_scale);
void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t interval);

}  // namespace fulgor::detail::compat
