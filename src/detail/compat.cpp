#include "fulgor/detail/compat.h"

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <torch/torch.h>

namespace fulgor::detail::compat {

std::string privateuse1_backend_name() {
#if FULGOR_TORCH_AT_LEAST(2, 1)
  return c10::is_privateuse1_backend_registered() ? c10::get_privateuse1_backend() : std::string();
#else
  return {};
#endif
}

std::optional<c10::ScalarType> newer_safetensors_dtype(const std::string& name) {
#if FULGOR_TORCH_AT_LEAST(2, 3)
  if (name == "U16") return c10::ScalarType::UInt16;
  if (name == "U32") return c10::ScalarType::UInt32;
  if (name == "U64") return c10::ScalarType::UInt64;
#endif
#if FULGOR_TORCH_AT_LEAST(2, 1)
  if (name == "F8_E4M3") return c10::ScalarType::Float8_e4m3fn;
  if (name == "F8_E5M2") return c10::ScalarType::Float8_e5m2;
#endif
  (void)name;
  return std::nullopt;
}

#if FULGOR_TORCH_AT_LEAST(2, 4)

bool autocast_supported(c10::DeviceType device_type) { return at::autocast::is_autocast_available(device_type); }

std::pair<bool, c10::ScalarType> autocast_state(c10::DeviceType device_type) {
  return {at::autocast::is_autocast_enabled(device_type), at::autocast::get_autocast_dtype(device_type)};
}

std::pair<bool, c10::ScalarType> set_autocast(c10::DeviceType device_type, bool enabled, c10::ScalarType dtype) {
  const auto previous = autocast_state(device_type);
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
  return previous;
}

#else

// LibTorch before 2.4 has one pair of functions per device type, and autocast
// only on these three.
bool autocast_supported(c10::DeviceType device_type) {
  return device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA ||
         device_type == c10::DeviceType::XPU;
}

std::pair<bool, c10::ScalarType> autocast_state(c10::DeviceType device_type) {
  switch (device_type) {
    case c10::DeviceType::CPU:
      return {at::autocast::is_cpu_enabled(), at::autocast::get_autocast_cpu_dtype()};
    case c10::DeviceType::CUDA:
      return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
    case c10::DeviceType::XPU:
      return {at::autocast::is_xpu_enabled(), at::autocast::get_autocast_xpu_dtype()};
    default:
      TORCH_CHECK(false, "autocast is not supported on ", device_type, " by this LibTorch");
  }
}

std::pair<bool, c10::ScalarType> set_autocast(c10::DeviceType device_type, bool enabled, c10::ScalarType dtype) {
  const auto previous = autocast_state(device_type);
  switch (device_type) {
    case c10::DeviceType::CPU:
      at::autocast::set_cpu_enabled(enabled);
      at::autocast::set_autocast_cpu_dtype(dtype);
      break;
    case c10::DeviceType::CUDA:
      at::autocast::set_enabled(enabled);
      at::autocast::set_autocast_gpu_dtype(dtype);
      break;
    case c10::DeviceType::XPU:
      at::autocast::set_xpu_enabled(enabled);
      at::autocast::set_autocast_xpu_dtype(dtype);
      break;
    default:
      TORCH_CHECK(false, "autocast is not supported on ", device_type, " by this LibTorch");
  }
  return previous;
}

#endif

void autocast_enter() { at::autocast::increment_nesting(); }

void autocast_exit() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

#if FULGOR_TORCH_AT_LEAST(2, 3)

void unscale_grads(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf, const torch::Tensor& inv_scale) {
  if (!grads.empty()) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
}

void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t interval) {
  at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, interval);
}

#else

// Before 2.3 the fused kernels exist for CUDA only.
void unscale_grads(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf, const torch::Tensor& inv_scale) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& grad : grads) {
    found_inf.copy_(torch::logical_or(found_inf.to(torch::kBool), grad.isfinite().all().logical_not()).to(found_inf));
    grad.mul_(inv_scale.to(grad.device()));
  }
}

void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t interval) {
  torch::NoGradGuard no_grad;
  if (found_inf.item<float>() > 0) {
    scale.mul_(backoff_factor);
    growth_tracker.zero_();
    return;
  }
  growth_tracker.add_(1);
  if (growth_tracker.item<int64_t>() == interval) {
    scale.mul_(growth_factor);
    growth_tracker.zero_();
  }
}

#endif

}  // namespace fulgor::detail::compat
