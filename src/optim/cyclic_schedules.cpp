#include "fulgor/optim/cyclic_schedules.h"

#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <limits>
#include <utility>

#include "fulgor/core/error.h"
#include "optim/schedule_support.h"

namespace fulgor {

// Note [Exact arithmetic] in lr_scheduler.cpp: torch's operations, in its order.

namespace {

// One value per parameter group, from one for all or one for each (torch's _format_param).
std::vector<double> per_group(const char* schedule, const char* name, const std::vector<double>& values,
                              size_t groups) {
  if (values.size() == 1) return std::vector<double>(groups, values[0]);
  if (values.size() != groups)
    throw ConfigError(fmt::format("{}: {} has {} values; expected 1 or one per parameter group ({})", schedule, name,
                                  values.size(), groups));
  return values;
}

// Note [Momentum or beta1]
// torch cycles group["momentum"] where the optimizer has one (SGD, RMSprop)
// and beta1 where it has betas (Adam, AdamW); other optimizers are refused.
struct Momentum {
  static bool supported(torch::optim::OptimizerOptions& o) {
    return dynamic_cast<torch::optim::SGDOptions*>(&o) || dynamic_cast<torch::optim::RMSpropOptions*>(&o) ||
           dynamic_cast<torch::optim::AdamOptions*>(&o) || dynamic_cast<torch::optim::AdamWOptions*>(&o);
  }
  static double get(torch::optim::OptimizerOptions& o) {
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) return sgd->momentum();
    if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) return rms->momentum();
    if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o)) return std::get<0>(adam->betas());
    return std::get<0>(dynamic_cast<torch::optim::AdamWOptions&>(o).betas());
  }
  static void set(torch::optim::OptimizerOptions& o, double m) {
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) {
      sgd->momentum(m);
    } else if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) {
      rms->momentum(m);
    } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o)) {
      adam->betas({m, std::get<1>(adam->betas())});
    } else {
      auto& adamw = dynamic_cast<torch::optim::AdamWOptions&>(o);
      adamw.betas({m, std::get<1>(adamw.betas())});
    }
  }
};

void require_momentum(const char* schedule, torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups())
    if (!Momentum::supported(group.options()))
      throw ConfigError(
          fmt::format("{}: cycle_momentum needs an optimizer with momentum or betas (SGD, RMSprop, "
                      "Adam, AdamW); set cycle_momentum = false for others",
                      schedule));
}

std::vector<double> group_momenta(torch::optim::Optimizer& optimizer) {
  std::vector<double> m;
  for (auto& group : optimizer.param_groups()) m.push_back(Momentum::get(group.options()));
  return m;
}

void set_momenta(torch::optim::Optimizer& optimizer, const std::vector<double>& momenta) {
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size() && i < momenta.size(); ++i) Momentum::set(groups[i].options(), momenta[i]);
}

}  // namespace

using detail::sole_schedule;
using detail::stored_initial_rates;

CyclicLR::CyclicLR(torch::optim::Optimizer& optimizer, CyclicOptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  const size_t groups = optimizer.param_groups().size();
  const auto base = per_group("CyclicLR", "base_lr", options_.base_lr, groups);
  max_lrs_ = per_group("CyclicLR", "max_lr", options_.max_lr, groups);
  const double up = options_.step_size_up, down = options_.step_size_down.value_or(up);
  if (!(up > 0) || !(down >= 0))
    throw ConfigError(
        fmt::format("CyclicLR: step_size_up={}, step_size_down={}: expected up > 0 and down >= 0", up, down));
  total_size_ = up + down;
  step_ratio_ = up / total_size_;
  const auto& mode = options_.mode;
  if (!options_.scale_fn && mode != "triangular" && mode != "triangular2" && mode != "exp_range")
    throw ConfigError(fmt::format(
        "CyclicLR: mode \"{}\": expected \"triangular\", \"triangular2\" or \"exp_range\", or a scale_fn", mode));
  if (options_.scale_fn && options_.scale_mode != "cycle" && options_.scale_mode != "iterations")
    throw ConfigError(
        fmt::format("CyclicLR: scale_mode \"{}\": expected \"cycle\" or \"iterations\"", options_.scale_mode));
  if (!options_.scale_fn) options_.scale_mode = mode == "exp_range" ? "iterations" : "cycle";
  // torch sets the rates to base_lr before its base constructor takes them as
  // the initial rates of an optimizer that has none yet.
  if (sole_schedule(optimizer)) set_initial_lrs(base);
  apply(base);
  base_lrs_ = stored_initial_rates(optimizer);
  if (options_.cycle_momentum) {
    require_momentum("CyclicLR", optimizer);
    base_momentums_ = per_group("CyclicLR", "base_momentum", options_.base_momentum, groups);
    max_momentums_ = per_group("CyclicLR", "max_momentum", options_.max_momentum, groups);
    set_momenta(optimizer, max_momentums_);
  }
  initial_step();
  base_lrs_ = base;
}

double CyclicLR::scale(double x) const {
  if (options_.scale_fn) return options_.scale_fn(x);
  if (options_.mode == "triangular") return 1.0;
  if (options_.mode == "triangular2") return 1 / std::pow(2.0, x - 1);
  return std::pow(options_.gamma, x);
}

std::vector<double> CyclicLR::get_lr() {
  const double e = static_cast<double>(last_epoch_);
  const double cycle = std::floor(1 + e / total_size_);
  const double x = 1.0 + e / total_size_ - cycle;
  const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  const double s = scale(options_.scale_mode == "cycle" ? cycle : e);
  std::vector<double> lrs;
  for (size_t i = 0; i < base_lrs_.size(); ++i) {
    const double base_height = (max_lrs_[i] - base_lrs_[i]) * scale_factor;
    lrs.push_back(base_lrs_[i] + base_height * s);
  }
  if (options_.cycle_momentum) {
    std::vector<double> momenta;
    for (size_t i = 0; i < base_momentums_.size(); ++i) {
      const double base_height = (max_momentums_[i] - base_momentums_[i]) * scale_factor;
      momenta.push_back(max_momentums_[i] - base_height * s);
    }
    set_momenta(optimizer_, momenta);
  }
  return lrs;
}

nlohmann::json CyclicLR::state_dict() const {
  auto s = LRScheduler::state_dict();
  if (options_.cycle_momentum) s["last_momentum"] = group_momenta(optimizer_);
  return s;
}

void CyclicLR::load_state_dict(const nlohmann::json& state) {
  LRScheduler::load_state_dict(state);
  if (options_.cycle_momentum) set_momenta(optimizer_, state.at("last_momentum").get<std::vector<double>>());
}

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleOptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  const auto& o = options_;
  if (o.total_steps) {
    if (*o.total_steps <= 0)
      throw ConfigError(fmt::format("OneCycleLR: total_steps={}: expected a positive integer", *o.total_steps));
    total_steps_ = *o.total_steps;
  } else if (o.epochs && o.steps_per_epoch) {
    if (*o.epochs <= 0 || *o.steps_per_epoch <= 0)
      throw ConfigError(fmt::format("OneCycleLR: epochs={}, steps_per_epoch={}: expected positive integers", *o.epochs,
                                    *o.steps_per_epoch));
    total_steps_ = *o.epochs * *o.steps_per_epoch;
  } else {
    throw ConfigError("OneCycleLR: give total_steps, or epochs and steps_per_epoch");
  }
  if (o.pct_start < 0 || o.pct_start > 1)
    throw ConfigError(fmt::format("OneCycleLR: pct_start={}: expected a value from 0 to 1", o.pct_start));
  if (o.anneal_strategy != "cos" && o.anneal_strategy != "linear")
    throw ConfigError(
        fmt::format("OneCycleLR: anneal_strategy \"{}\": expected \"cos\" or \"linear\"", o.anneal_strategy));
  const double total = static_cast<double>(total_steps_);
  const double up_end = o.pct_start * total - 1;
  // Rates: 0 initial, 1 max, 2 min; momenta: 0 max, 1 base.
  if (o.three_phase)
    phases_ = {{up_end, 0, 1, 0, 1}, {2 * o.pct_start * total - 2, 1, 0, 1, 0}, {total - 1, 0, 2, 0, 0}};
  else
    phases_ = {{up_end, 0, 1, 0, 1}, {total - 1, 1, 2, 1, 0}};
  const size_t groups = optimizer.param_groups().size();
  std::vector<double> initial;
  for (double max : per_group("OneCycleLR", "max_lr", o.max_lr, groups)) {
    const double start = max / o.div_factor;
    initial.push_back(start);
    rates_.push_back({start, max, start / o.final_div_factor});
  }
  set_initial_lrs(initial);
  base_lrs_ = initial;
  if (o.cycle_momentum) {
    require_momentum("OneCycleLR", optimizer);
    const auto max = per_group("OneCycleLR", "max_momentum", o.max_momentum, groups);
    const auto base = per_group("OneCycleLR", "base_momentum", o.base_momentum, groups);
    for (size_t i = 0; i < groups; ++i) momenta_.push_back({max[i], base[i]});
    set_momenta(optimizer, max);
  }
  initial_step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy == "cos") {
    const double cos_out = std::cos(M_PI * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

std::vector<double> OneCycleLR::get_lr() {
  if (last_epoch_ > total_steps_)
    throw ConfigError(fmt::format("OneCycleLR: stepped {} times; total_steps is {}", last_epoch_, total_steps_));
  const double step = static_cast<double>(last_epoch_);
  double start_step = 0.0;
  const Phase* phase = &phases_.back();
  for (const auto& p : phases_) {
    if (step <= p.end_step) {
      phase = &p;
      break;
    }
    if (&p != &phases_.back()) start_step = p.end_step;
  }
  if (phase->end_step == start_step)
    throw ConfigError(fmt::format("OneCycleLR: a phase of no steps (pct_start={}, total_steps={})", options_.pct_start,
                                  total_steps_));
  const double pct = (step - start_step) / (phase->end_step - start_step);
  std::vector<double> lrs, momenta;
  for (size_t i = 0; i < rates_.size(); ++i) {
    lrs.push_back(anneal(rates_[i][phase->start], rates_[i][phase->end], pct));
    if (options_.cycle_momentum)
      momenta.push_back(anneal(momenta_[i][phase->start_momentum], momenta_[i][phase->end_momentum], pct));
  }
  if (options_.cycle_momentum) set_momenta(optimizer_, momenta);
  return lrs;
}

nlohmann::json OneCycleLR::state_dict() const {
  auto s = LRScheduler::state_dict();
  if (options_.cycle_momentum) s["last_momentum"] = group_momenta(optimizer_);
  return s;
}

void OneCycleLR::load_state_dict(const nlohmann::json& state) {
  LRScheduler::load_state_dict(state);
  if (options_.cycle_momentum) set_momenta(optimizer_, state.at("last_momentum").get<std::vector<double>>());
}

}  // namespace fulgor
