#pragma once

#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fulgor {

/// A learning-rate schedule over an optimizer's parameter groups.
///
/// Contract: the constructor records each group's learning rate as its base.
/// step() advances the schedule by one interval (a step or an epoch, as the
/// SchedulerConfig says) and writes the new rates into the optimizer.
/// state_dict()/load_state_dict() hold everything needed to continue exactly
/// after a resume. Subclasses compute the rates in closed form from the count,
/// so a restored count gives the same rates.
class LRScheduler {
 public:
  explicit LRScheduler(torch::optim::Optimizer& optimizer);
  virtual ~LRScheduler() = default;

  /// Advances one interval. `metric` is the monitored value when the
  /// SchedulerConfig names one; schedules that need it say so in needs_metric().
  virtual void step(std::optional<double> metric = std::nullopt);
  virtual bool needs_metric() const { return false; }

  /// How many times step() was called.
  int64_t last_epoch() const { return last_epoch_; }
  /// The optimizer whose rates this schedule sets.
  const torch::optim::Optimizer& optimizer() const { return optimizer_; }
  /// The learning rates step() last set, one per parameter group.
  std::vector<double> get_last_lr() const;

  virtual nlohmann::json state_dict() const;
  virtual void load_state_dict(const nlohmann::json& state);

 protected:
  /// The rates after `count` steps.
  virtual std::vector<double> compute_lrs(int64_t count) const = 0;
  void apply(const std::vector<double>& lrs);

  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = 0;
};

/// Multiplies the rates by `gamma` every `step_size` intervals (torch.optim.lr_scheduler.StepLR).
class StepLR : public LRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> compute_lrs(int64_t count) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// Sets each rate to its base times `factor(count)` (torch.optim.lr_scheduler.LambdaLR).
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor);

 protected:
  std::vector<double> compute_lrs(int64_t count) const override;

 private:
  std::function<double(int64_t)> factor_;
};

/// Options of ReduceLROnPlateau, with torch.optim's defaults.
struct PlateauOptions {
  std::string mode = "min";  ///< "min" or "max"
  double factor = 0.1;
  int64_t patience = 10;
  double threshold = 1e-4;  ///< relative improvement needed
  int64_t cooldown = 0;
  double min_lr = 0.0;
};

/// Multiplies the rates by `factor` when the monitored metric has not improved
/// for `patience` intervals (torch.optim.lr_scheduler.ReduceLROnPlateau).
/// Requires a SchedulerConfig with `monitor` set.
class ReduceLROnPlateau : public LRScheduler {
 public:
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, PlateauOptions options = {});
  void step(std::optional<double> metric = std::nullopt) override;
  bool needs_metric() const override { return true; }
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> compute_lrs(int64_t count) const override;

 private:
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
/// [Several optimizers] in src/trainer/manual_optimization.cpp).
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
