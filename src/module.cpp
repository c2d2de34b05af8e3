#include "fulgor/module.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>

#include "fulgor/core/error.h"

namespace fulgor {

namespace {

// Note [Reading a logged value]
// item() goes through the dispatcher, which on a small model costs as much
// as the rest of the Trainer's work per step. A floating-point value in host
// memory is read directly instead; any other host tensor (integral, with a
// lazy negation) through item(). Neither records anything for autograd, so no
// detach() is needed. Tensors on a device are read later, many at once (Note
// [Deferred reads] in src/loops/metric_store.h).
double value_of(const torch::Tensor& t) {
  if (t.device().is_cpu() && t.layout() == torch::kStrided && !t.is_neg() && !t._is_zerotensor()) {
    switch (t.scalar_type()) {
      case torch::kFloat:
        return *t.data_ptr<float>();
      case torch::kDouble:
        return *t.data_ptr<double>();
      case torch::kBFloat16:
        return static_cast<float>(*t.data_ptr<c10::BFloat16>());
      case torch::kHalf:
        return static_cast<float>(*t.data_ptr<c10::Half>());
      default:
        break;
    }
  }
  return t.item<double>();
}

[[noreturn]] void throw_not_running(std::string_view name, const std::string& module) {
  throw Error(fmt::format("log('{}', ...) was called on {} while no Trainer loop is running it", name, module));
}

}  // namespace

void ModuleBase::log(std::string_view name, const torch::Tensor& value, const LogOptions& options) {
  if (!value.defined() || value.numel() != 1)
    throw ConfigError(fmt::format(
        "log('{}', ...): expected a tensor with one element, got {}", name,
        value.defined() ? fmt::format("shape [{}]", fmt::join(value.sizes(), ", ")) : "an undefined tensor"));
  if (sink_ == nullptr) throw_not_running(name, torch::nn::Module::name());
  if (value.device().is_cpu())
    sink_->log(name, value_of(value), options);
  else
    sink_->log_on_device(name, value, options);
}

void ModuleBase::log(std::string_view name, double value, const LogOptions& options) {
  if (sink_ == nullptr) throw_not_running(name, torch::nn::Module::name());
  sink_->log(name, value, options);
}

void ModuleBase::log(std::string_view name, metrics::Metric& metric, const LogOptions& options) {
  if (sink_ == nullptr) throw_not_running(name, torch::nn::Module::name());
  sink_->log_metric(name, metric, options);
}

void ModuleBase::log_dict(const std::map<std::string, double>& values, const LogOptions& options) {
  for (const auto& [name, value] : values) log(name, value, options);
}

std::vector<ManualOptimizer>& ModuleBase::optimizers() {
  if (manual_steps_ == nullptr)
    throw Error(fmt::format("{}.optimizers(): no fit is running the module; its optimizers exist while one does",
                            torch::nn::Module::name()));
  return manual_optimizers_;
}

std::vector<std::shared_ptr<LRScheduler>> ModuleBase::lr_schedulers() const {
  std::vector<std::shared_ptr<LRScheduler>> schedulers;
  for (const auto& config : optim_config().schedulers) schedulers.push_back(config.scheduler);
  return schedulers;
}

void ModuleBase::manual_backward(const torch::Tensor& loss) {
  if (automatic_optimization_)
    throw ConfigError(fmt::format(
        "{}: to use manual_backward, turn automatic optimization off: call set_automatic_optimization(false)",
        torch::nn::Module::name()));
  if (manual_steps_ == nullptr)
    throw Error(fmt::format("{}.manual_backward(): no fit is running the module", torch::nn::Module::name()));
  manual_steps_->backward(loss);
}

// Lightning's toggle_optimizer and untoggle_optimizer, parameters being told
// apart by their storage object (a parameter in two optimizers is recorded once).
void ModuleBase::toggle_optimizer(torch::optim::Optimizer& optimizer) {
  toggled_.clear();
  auto recorded = [&](const torch::Tensor& p) {
    return std::find_if(toggled_.begin(), toggled_.end(), [&](const auto& entry) { return entry.first.is_same(p); });
  };
  for (const auto& opt : optim_config().optimizers)
    for (const auto& group : opt->param_groups())
      for (const auto& p : group.params()) {
        if (recorded(p) != toggled_.end()) continue;
        toggled_.emplace_back(p, p.requires_grad());
        p.set_requires_grad(false);
      }
  for (const auto& group : optimizer.param_groups())
    for (auto p : group.params()) {
      auto entry = recorded(p);
      if (entry == toggled_.end())
        throw ConfigError(fmt::format("{}.toggle_optimizer: the optimizer is not one configure_optimizers returned",
                                      torch::nn::Module::name()));
      p.set_requires_grad(entry->second);
    }
}

void ModuleBase::untoggle_optimizer(torch::optim::Optimizer& optimizer) {
  for (const auto& opt : optim_config().optimizers) {
    if (opt.get() == &optimizer) continue;
    for (const auto& group : opt->param_groups())
      for (auto p : group.params())
        for (const auto& [param, required] : toggled_)
          if (param.is_same(p)) p.set_requires_grad(required);
  }
  toggled_.clear();
}

ToggledOptimizer::ToggledOptimizer(ModuleBase& module, torch::optim::Optimizer& optimizer)
    : module_(module), optimizer_(optimizer) {
  module_.toggle_optimizer(optimizer_);
}

ToggledOptimizer::~ToggledOptimizer() { module_.untoggle_optimizer(optimizer_); }

const OptimizerConfig& ModuleBase::optim_config() const {
  trainer();  // throws, naming the module, where no Trainer is attached (which sets both)
  return *optim_;
}

Trainer& ModuleBase::trainer() const {
  if (trainer_ == nullptr) throw Error(fmt::format("{} is not attached to a Trainer", torch::nn::Module::name()));
  return *trainer_;
}

void ModuleBase::clip_gradients(torch::optim::Optimizer& optimizer, std::optional<double> clip_val,
                                const std::string& algorithm) {
  if (!clip_val || *clip_val == 0) return;
  if (algorithm != "norm" && algorithm != "value")
    throw ConfigError(fmt::format("unknown gradient_clip_algorithm '{}'; known: norm, value", algorithm));
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) params.push_back(p);
  if (algorithm == "norm" && sharded_gradient_norm_) {
    // torch::nn::utils::clip_grad_norm_'s rule, with the norm over the ranks.
    const double coefficient = *clip_val / (sharded_gradient_norm_(params) + 1e-6);
    torch::NoGradGuard no_grad;
    if (coefficient < 1)
      for (auto& p : params) p.mutable_grad().mul_(coefficient);
  } else if (algorithm == "norm") {
    torch::nn::utils::clip_grad_norm_(params, *clip_val);
  } else {
    torch::nn::utils::clip_grad_value_(params, *clip_val);
  }
}

namespace impl {
void throw_step_not_implemented(const ModuleBase& module, const char* step) {
  throw ConfigError(fmt::format("{} does not override {}, which this loop needs", module.name(), step));
}
}  // namespace impl

}  // namespace fulgor
