#include "fulgor/precision/precision.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <unordered_map>

#include "fulgor/detail/compat.h"
#include "fulgor/core/error.h"

namespace fulgor {
namespace {

struct Known {
  const char* name;
  const char* alias;
  bool mixed;
  torch::ScalarType dtype;
};

constexpr Known kKnown[] = {
    {"32-true", "32", false, torch::kFloat},        {"64-true", "64", false, torch::kDouble},
    {"bf16-mixed", "bf16", true, torch::kBFloat16}, {"16-mixed", "16", true, torch::kHalf},
    {"bf16-true", "", false, torch::kBFloat16},     {"16-true", "", false, torch::kHalf},
};

}  // namespace

std::vector<std::string> Precision::known() {
  std::vector<std::string> names;
  for (const Known& k : kKnown) names.emplace_back(k.name);
  return names;
}

Precision Precision::parse(const std::string& value, const Accelerator& accelerator) {
  const Known* match = nullptr;
  for (const Known& k : kKnown)
    if (value == k.name || (k.alias[0] != '\0' && value == k.alias)) match = &k;
  if (match == nullptr)
    throw ConfigError(fmt::format("precision '{}' is not known; accepted: {} (aliases 32, 64, bf16, 16)", value,
                                  fmt::join(known(), ", ")));
  const auto supported = accelerator.supported_precisions();
  bool supported_here = std::find(supported.begin(), supported.end(), match->name) != supported.end();
  std::string why;
  if (match->mixed && supported_here && !detail::compat::autocast_supported(accelerator.autocast_device_type())) {
    supported_here = false;
    why = " (this LibTorch has no autocast for its device type)";
  }
  if (!supported_here)
    throw DeviceError(fmt::format("precision '{}' is not supported by accelerator '{}'{}; it supports: {}", match->name,
                                  accelerator.name(), why, fmt::join(supported, ", ")));
  return Precision{match->name, match->mixed, match->dtype};
}

void Precision::convert_module(torch::nn::Module& module) const {
  if (converts_module()) module.to(dtype);
}

torch::Tensor Precision::convert_input(const torch::Tensor& input) const {
  if (!converts_module() || !input.defined() || !input.is_floating_point()) return input;
  return input.to(dtype);
}

void AutocastScope::enter(const Precision& precision, const Accelerator& accelerator) {
  device_type_ = accelerator.autocast_device_type();
  std::tie(previous_enabled_, previous_dtype_) = detail::compat::set_autocast(device_type_, true, precision.dtype);
  detail::compat::autocast_enter();
  active_ = true;
}

void AutocastScope::exit() {
  detail::compat::autocast_exit();
  detail::compat::set_autocast(device_type_, previous_enabled_, previous_dtype_);
}

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options),
      scale_(torch::full({1}, options.init_scale, torch::kFloat)),
      growth_tracker_(torch::zeros({1}, torch::kInt)),
      found_inf_(torch::zeros({1}, torch::kFloat)) {
  if (options_.init_scale <= 0 || options_.growth_factor <= 1 || options_.backoff_factor <= 0 ||
      options_.backoff_factor >= 1 || options_.growth_interval < 1)
    throw ConfigError(
        fmt::format("GradScaler options are not valid: init_scale={} (> 0), growth_factor={} (> 1), backoff_factor={} "
                    "(between 0 and 1), growth_interval={} (>= 1)",
                    options_.init_scale, options_.growth_factor, options_.backoff_factor, options_.growth_interval));
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!options_.enabled) return loss;
  return loss * scale_.to(loss.device());
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled || unscaled_) return;
  torch::NoGradGuard no_grad;
  found_inf_.zero_();
  const torch::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  // The fused kernel wants its flag and factor on the gradients' device.
  std::unordered_map<torch::Device, std::vector<torch::Tensor>> grads_by_device;
  for (const auto& group : optimizer.param_groups())
    for (const auto& param : group.params())
      if (param.grad().defined()) grads_by_device[param.grad().device()].push_back(param.grad());
  for (auto& [device, grads] : grads_by_device) {
    torch::Tensor found = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    detail::compat::unscale_grads(grads, found, inv_scale.to(device));
    found_inf_.add_(found.cpu());
  }
  if (reduce_found_inf_) reduce_found_inf_(found_inf_);
  unscaled_ = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  unscale(optimizer);
  if (found_inf_.item<float>() > 0) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  detail::compat::update_scale(scale_, growth_tracker_, found_inf_.clamp_max(1), options_.growth_factor,
                               options_.backoff_factor, options_.growth_interval);
  found_inf_.zero_();
  unscaled_ = false;
}

double GradScaler::get_scale() const { return scale_.item<double>(); }

int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", scale_);
  archive.write("growth_tracker", growth_tracker_);
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor scale, tracker;
  archive.read("scale", scale);
  archive.read("growth_tracker", tracker);
  scale_.copy_(scale);
  growth_tracker_.copy_(tracker);
}

}  // namespace fulgor
