#pragma once

// The base of fulgor's learning-rate schedules (the families beside it:
// multiplicative, cosine, cyclic, composite, ReduceLROnPlateau; fulgor/optim/scheduler.h
// includes them all).

#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

/// A learning-rate schedule over an optimizer's parameter groups, with
/// torch.optim.lr_scheduler's meanings and its arithmetic, operation for
/// operation, so that fulgor's rates equal torch's to the last bits.
///
/// Contract: a schedule's constructor takes the rates its optimizer had before
/// its first schedule was made as the base rates (torch's group["initial_lr"],
/// Note [Initial rates] in src/optim/lr_scheduler.cpp) and performs torch's initial
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

}  // namespace fulgor
