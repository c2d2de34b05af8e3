#pragma once

#include <optional>
#include <string>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"
#include "fulgor/optim/scheduler.h"

namespace fulgor {

/// Logs each optimizer's learning rates (Lightning's LearningRateMonitor) as
/// `lr-<Optimizer>` (`lr-<Optimizer>/pg<N>` for parameter groups past the first,
/// or the scheduler's name when it has one).
///
/// Contract: with `logging_interval` unset, logs at the interval of each
/// optimizer's scheduler (at epoch start without one); Interval::step logs
/// before the training batches whose logs are due (every log_every_n_steps
/// optimizer steps, as Lightning does), Interval::epoch at every epoch start.
class FULGOR_API LearningRateMonitor : public Callback {
 public:
  explicit LearningRateMonitor(std::optional<Interval> logging_interval = std::nullopt)
      : logging_interval_(logging_interval) {}
  void on_train_epoch_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;

 private:
  void log(Trainer& trainer, Interval interval);
  std::optional<Interval> logging_interval_;
};

}  // namespace fulgor
