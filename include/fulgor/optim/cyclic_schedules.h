#pragma once

// The schedules that cycle the rates and the momentum: CyclicLR and OneCycleLR.

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/optim/lr_scheduler.h"

namespace fulgor {

/// Options of CyclicLR, with torch's defaults. `base_lr` and `max_lr` hold one
/// value for all parameter groups or one for each.
struct FULGOR_API CyclicOptions {
  std::vector<double> base_lr;
  std::vector<double> max_lr;
  double step_size_up = 2000;
  std::optional<double> step_size_down;  ///< default: step_size_up
  std::string mode = "triangular";       ///< "triangular", "triangular2" or "exp_range"
  double gamma = 1.0;                    ///< exp_range's factor per iteration
  /// Replaces the mode's amplitude scaling when set.
  std::function<double(double)> scale_fn;
  std::string scale_mode = "cycle";  ///< scale_fn's argument: "cycle" or "iterations"
  bool cycle_momentum = true;        ///< momentum (or Adam's beta1) cycles inversely
  std::vector<double> base_momentum = {0.8};
  std::vector<double> max_momentum = {0.9};
};

/// Cycles the rates between base_lr and max_lr (torch.optim.lr_scheduler.CyclicLR),
/// and the momentum, or beta1 of Adam-like optimizers, the other way.
class FULGOR_API CyclicLR : public LRScheduler {
 public:
  CyclicLR(torch::optim::Optimizer& optimizer, CyclicOptions options);
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override;

 private:
  double scale(double x) const;

  CyclicOptions options_;
  std::vector<double> max_lrs_, base_momentums_, max_momentums_;
  double total_size_, step_ratio_;
};

/// Options of OneCycleLR, with torch's defaults. Give total_steps, or epochs
/// and steps_per_epoch. `max_lr` and the momenta hold one value for all
/// parameter groups or one for each.
struct OneCycleOptions {
  std::vector<double> max_lr;
  std::optional<int64_t> total_steps;
  std::optional<int64_t> epochs;
  std::optional<int64_t> steps_per_epoch;
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";  ///< "cos" or "linear"
  bool cycle_momentum = true;           ///< momentum (or Adam's beta1) cycles inversely
  std::vector<double> base_momentum = {0.85};
  std::vector<double> max_momentum = {0.95};
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

/// The 1cycle policy (torch.optim.lr_scheduler.OneCycleLR): up from
/// max_lr/div_factor to max_lr, then down to far below the start, with the
/// momentum, or beta1 of Adam-like optimizers, the other way. Stepping beyond
/// total_steps is a ConfigError, as torch's ValueError.
class FULGOR_API OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleOptions options);
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override;

 private:
  struct Phase {
    double end_step;
    int start, end;  // indices into a group's {initial, max, min} rates or {max, base} momenta
    int start_momentum, end_momentum;
  };
  double anneal(double start, double end, double pct) const;

  OneCycleOptions options_;
  int64_t total_steps_;
  std::vector<Phase> phases_;
  std::vector<std::array<double, 3>> rates_;    // per group: initial, max, min
  std::vector<std::array<double, 2>> momenta_;  // per group: max, base
};

}  // namespace fulgor
