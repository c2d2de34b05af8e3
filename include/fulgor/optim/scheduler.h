#pragma once

#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

/// A learning-rate schedule over an optimizer's parameter groups, with
/// torch.optim.lr_scheduler's meanings and its arithmetic, operation for
/// operation, so that fulgor's rates equal torch's to the last bits.
///
/// Contract: a schedule's constructor takes the rates its optimizer had before
/// its first schedule was made as the base rates (torch's group["initial_lr"],
/// Note [Initial rates] in src/optim/scheduler.cpp) and performs torch's initial
/// step, which may already change the rates (LinearLR's start_factor). step()
/// advances by one interval (a step or an epoch, as the SchedulerConfig says)
/// and writes the new rates into the optimizer. state_dict()/load_state_dict()
/// hold everything needed to continue exactly after a resume, the rates
/// included. A schedule lives no longer than its optimizer.
class FULGOR_API LRScheduler {
 public:
  explicit LRScheduler(torch::optim::Optimizer& optimizer);
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;
  virtual ~LRScheduler();

  /// Advances one interval. `metric` is the monitored value when the
  /// SchedulerConfig names one; schedules that need it say so in needs_metric().
  virtual void step(std::optional<double> metric = std::nullopt);
  virtual bool needs_metric() const { return false; }

  /// torch's last_epoch: how many times step() was called since the initial step.
  int64_t last_epoch() const { return last_epoch_; }
  /// The optimizer whose rates this schedule sets.
  const torch::optim::Optimizer& optimizer() const { return optimizer_; }
  /// The learning rates the schedule last set, one per parameter group.
  std::vector<double> get_last_lr() const { return last_lr_; }
  /// The rates the schedule scales (torch's base_lrs).
  const std::vector<double>& base_lrs() const { return base_lrs_; }

  virtual nlohmann::json state_dict() const;
  virtual void load_state_dict(const nlohmann::json& state);

 protected:
  /// torch's chainable get_lr(): the rates at last_epoch_, from the
  /// optimizer's current rates. May set other group options (momentum).
  virtual std::vector<double> get_lr() = 0;
  /// torch's _get_closed_form_lr(), where the schedule has one: the rates at
  /// last_epoch_ from the base rates alone.
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  /// torch's step(0), with which SequentialLR starts a schedule at its milestone.
  virtual void restart();
  /// torch's _initial_step(); each concrete constructor ends with it, as
  /// torch's base constructor does.
  void initial_step();
  /// SequentialLR's recursive_undo() of the initial step.
  virtual void undo_initial_step() { --last_epoch_; }

  /// The optimizer's current rates.
  std::vector<double> current_lrs() const;
  /// Writes `lrs` into the optimizer and keeps them as the last rates.
  void apply(const std::vector<double>& lrs);
  /// Makes `lrs` the optimizer's initial rates, as OneCycleLR and CyclicLR do.
  void set_initial_lrs(const std::vector<double>& lrs);

  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;

  friend class SequentialLR;
  friend class ChainedScheduler;
};

/// Sets each rate to its base times `factor(last_epoch)` (torch.optim.lr_scheduler.LambdaLR).
class FULGOR_API LambdaLR : public LRScheduler {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor);

 protected:
  std::vector<double> get_lr() override;

 private:
  std::function<double(int64_t)> factor_;
};

/// Multiplies the rates by `factor(last_epoch)` at every step after the first
/// (torch.optim.lr_scheduler.MultiplicativeLR).
class FULGOR_API MultiplicativeLR : public LRScheduler {
 public:
  MultiplicativeLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor);

 protected:
  std::vector<double> get_lr() override;

 private:
  std::function<double(int64_t)> factor_;
};

/// Multiplies the rates by `gamma` every `step_size` intervals (torch.optim.lr_scheduler.StepLR).
class FULGOR_API StepLR : public LRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// Multiplies the rates by `gamma` at each milestone, by gamma^k at one listed
/// k times (torch.optim.lr_scheduler.MultiStepLR).
class FULGOR_API MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  std::vector<int64_t> milestones_;  // sorted, repeats kept
  double gamma_;
};

/// Multiplies the rates by `factor` for the first `total_iters` intervals
/// (torch.optim.lr_scheduler.ConstantLR). Requires 0 <= factor <= 1.
class FULGOR_API ConstantLR : public LRScheduler {
 public:
  explicit ConstantLR(torch::optim::Optimizer& optimizer, double factor = 1.0 / 3, int64_t total_iters = 5);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double factor_;
  int64_t total_iters_;
};

/// Scales the rates linearly from `start_factor` to `end_factor` over
/// `total_iters` intervals (torch.optim.lr_scheduler.LinearLR, the usual
/// warmup). Requires 0 < start_factor <= 1 and 0 <= end_factor <= 1.
class FULGOR_API LinearLR : public LRScheduler {
 public:
  explicit LinearLR(torch::optim::Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
                    int64_t total_iters = 5);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double start_factor_;
  double end_factor_;
  int64_t total_iters_;
};

/// Multiplies the rates by `gamma` every interval (torch.optim.lr_scheduler.ExponentialLR).
class FULGOR_API ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(torch::optim::Optimizer& optimizer, double gamma);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double gamma_;
};

/// Decays the rates polynomially to zero over `total_iters` intervals
/// (torch.optim.lr_scheduler.PolynomialLR).
class FULGOR_API PolynomialLR : public LRScheduler {
 public:
  explicit PolynomialLR(torch::optim::Optimizer& optimizer, int64_t total_iters = 5, double power = 1.0);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  int64_t total_iters_;
  double power_;
};

/// Anneals the rates from their base to `eta_min` along half a cosine over
/// `T_max` intervals, and back up over the next T_max
/// (torch.optim.lr_scheduler.CosineAnnealingLR, its recursive form).
class FULGOR_API CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  int64_t T_max_;
  double eta_min_;
};

/// Cosine annealing restarted every T_i intervals, T_i starting at `T_0` and
/// multiplied by `T_mult` at each restart
/// (torch.optim.lr_scheduler.CosineAnnealingWarmRestarts).
class FULGOR_API CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, int64_t T_0, int64_t T_mult = 1,
                              double eta_min = 0.0);
  void step(std::optional<double> metric = std::nullopt) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override;
  void restart() override;

 private:
  int64_t T_0_;
  int64_t T_i_;
  int64_t T_mult_;
  double eta_min_;
  int64_t T_cur_ = -1;
};

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

/// Runs its schedules one after the other, switching at each milestone
/// (torch.optim.lr_scheduler.SequentialLR: the next schedule starts from its
/// step 0, with its closed form where it has one). Make the schedules first,
/// in order, then this; all on `optimizer`.
class FULGOR_API SequentialLR : public LRScheduler {
 public:
  SequentialLR(torch::optim::Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  void step(std::optional<double> metric = std::nullopt) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override { return last_lr_; }
  void undo_initial_step() override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

/// Steps all its schedules at every step, each from the rates the one before
/// left (torch.optim.lr_scheduler.ChainedScheduler).
class FULGOR_API ChainedScheduler : public LRScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers);
  void step(std::optional<double> metric = std::nullopt) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override { return last_lr_; }
  void undo_initial_step() override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

/// Options of ReduceLROnPlateau, with torch.optim's defaults.
struct PlateauOptions {
  std::string mode = "min";  ///< "min" or "max"
  double factor = 0.1;
  int64_t patience = 10;
  double threshold = 1e-4;  ///< improvement needed: relative, or absolute (threshold_mode)
  int64_t cooldown = 0;
  double min_lr = 0.0;
  std::string threshold_mode = "rel";  ///< "rel" or "abs"
  double eps = 1e-8;                   ///< a rate is left as it is when it would drop by no more
};

/// Multiplies the rates by `factor` when the monitored metric has not improved
/// for `patience` intervals (torch.optim.lr_scheduler.ReduceLROnPlateau).
/// Requires a SchedulerConfig with `monitor` set. An unknown mode or
/// threshold_mode, or a factor of 1 or more, is a ConfigError.
class FULGOR_API ReduceLROnPlateau : public LRScheduler {
 public:
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, PlateauOptions options = {});
  void step(std::optional<double> metric = std::nullopt) override;
  bool needs_metric() const override { return true; }
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override { return current_lrs(); }

 private:
  bool is_better(double value) const;

  PlateauOptions options_;
  double best_;
  int64_t num_bad_ = 0;
  int64_t cooldown_left_ = 0;
};

/// When a scheduler steps.
enum class Interval { step, epoch };

/// A scheduler and when the Trainer steps it (Lightning's lr_scheduler_config).
struct SchedulerConfig {
  std::shared_ptr<LRScheduler> scheduler;
  Interval interval = Interval::epoch;
  /// Steps every `frequency` intervals.
  int64_t frequency = 1;
  /// The logged metric passed to step(); required by schedules that need one.
  std::string monitor;
  /// Whether a missing monitored metric is an error (otherwise the step is skipped).
  bool strict = true;
  /// The name LearningRateMonitor uses (default: the optimizer's).
  std::string name;
};

/// What Module::configure_optimizers returns: the optimizers and their
/// schedulers (each scheduler knows its optimizer). Automatic optimization
/// steps one optimizer with each training_step's loss, so fit refuses
/// several with a ConfigError unless the module optimizes manually (Note
/// [Several optimizers] in src/loops/manual_optimization.cpp).
struct OptimizerConfig {
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers;
  std::vector<SchedulerConfig> schedulers;

  OptimizerConfig() = default;
  template <typename O, typename = std::enable_if_t<std::is_base_of_v<torch::optim::Optimizer, O>>>
  OptimizerConfig(std::shared_ptr<O> optimizer) : optimizers{std::move(optimizer)} {}
  template <typename O, typename = std::enable_if_t<std::is_base_of_v<torch::optim::Optimizer, O>>>
  OptimizerConfig(std::shared_ptr<O> optimizer, SchedulerConfig scheduler)
      : optimizers{std::move(optimizer)}, schedulers{std::move(scheduler)} {}
  OptimizerConfig(std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers,
                  std::vector<SchedulerConfig> schedulers = {})
      : optimizers(std::move(optimizers)), schedulers(std::move(schedulers)) {}
};

}  // namespace fulgor
