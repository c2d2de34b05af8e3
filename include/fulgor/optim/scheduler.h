#pragma once

// The learning-rate schedules, one header per family, and what
// configure_optimizers returns: the optimizers and their schedulers.

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgor/optim/composite_schedules.h"
#include "fulgor/optim/cosine_schedules.h"
#include "fulgor/optim/cyclic_schedules.h"
#include "fulgor/optim/lr_scheduler.h"
#include "fulgor/optim/multiplicative_schedules.h"
#include "fulgor/optim/reduce_lr_on_plateau.h"

namespace fulgor {

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
