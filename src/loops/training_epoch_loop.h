#pragma once

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>

#include "loops/evaluation_loop.h"
#include "loops/progress.h"

namespace fulgor::detail {

struct LoopContext;
struct LoopLimits;
class FitLoop;
struct AutomaticOptimization;

// When fit validates (Lightning's _should_check_val_epoch and
// _should_check_val_fx): in every check_val_every_n_epoch-th epoch, after
// every val_check_interval training batches (counted within the epoch when
// check_val_every_n_epoch is set, across epochs otherwise), or, with the
// default interval, once per epoch after its last batch.
class ValidationSchedule {
 public:
  ValidationSchedule(const LoopLimits& limits, bool validating, std::optional<int64_t> train_batches);

  bool in_epoch(int64_t epoch) const { return validating_ && (!every_n_epoch_ || (epoch + 1) % *every_n_epoch_ == 0); }
  // Whether to validate in `epoch` after `done_in_epoch` batches (`total` in
  // the fit), or at the epoch's end.
  bool due(int64_t epoch, int64_t done_in_epoch, int64_t total, bool epoch_end) const {
    if (!in_epoch(epoch)) return false;
    if (every_) {
      if (epoch_end) return false;
      const int64_t counter = every_n_epoch_ ? done_in_epoch : total;
      return counter % *every_ == 0;
    }
    // Once per epoch, after its last batch.
    if (train_batches_) return !epoch_end && done_in_epoch == *train_batches_;
    return epoch_end;
  }
  // Lightning's val_check_batch: the training batches between validations
  // (nullopt: once per epoch of a loader that does not tell its length).
  std::optional<int64_t> val_check_batch() const { return every_ ? every_ : train_batches_; }

 private:
  bool validating_;
  std::optional<int64_t> every_n_epoch_, train_batches_;
  std::optional<int64_t> every_;  // validate after every N training batches
};

// Lightning's _TrainingEpochLoop: the batches of one epoch and the validation
// runs they lead to. run() is reset, then a batch (advance, on-advance-end)
// until done; its state is the batches' progress, the optimizer steps
// (global_step) and, under manual optimization, the batches run.
class TrainingEpochLoop {
 public:
  TrainingEpochLoop(LoopContext& state, FitLoop& fit);
  ~TrainingEpochLoop();

  // A new fit over `train`, validating on `val` (nullptr: no validation).
  void reset_for_fit(StepRunner& train, StepRunner* val);
  // Once the training batches per epoch are known (FitLoop::setup_data).
  void setup(std::optional<int64_t> num_training_batches);
  // Lightning's reset: a fresh epoch counts its batches from zero; one
  // resumed in its middle fetches and drops the batches it had done.
  // `begun_there`: the loader starts at the checkpoint's batch already.
  void reset(bool resuming, bool begun_there = false);
  void run();
  // Its counters in the fit loop's state (Note [The loops' state in a
  // checkpoint] in fit_loop.cpp).
  void state_dict(nlohmann::json& loop) const;
  void load_state_dict(const nlohmann::json& loop);

  // Lightning's _num_ready_batches_reached: the epoch's last batch is
  // fetched, or the loader has run out.
  bool reached_last_batch() const;
  // Whether the loggers' step labels count batches (manual optimization) or
  // optimizer steps.
  int64_t logging_step() const;
  bool has_schedule() const { return schedule_.has_value(); }
  const ValidationSchedule& schedule() const { return *schedule_; }
  // Steps the epoch-interval schedulers as the `epochs`-th epoch ends.
  void step_epoch_schedulers(int64_t epochs);

  BatchProgress batch_progress;
  // Optimizer steps taken (Lightning's optim_progress.optimizer_steps; under
  // manual optimization, the steps the module took).
  int64_t global_step = 0;
  // Lightning's _batches_that_stepped, under manual optimization.
  int64_t batches_that_stepped = 0;
  EvaluationLoop val_loop;

 private:
  bool done();
  bool advance();
  void on_advance_end();
  void on_run_end();
  void validate();

  LoopContext& s;
  FitLoop& fit_;
  StepRunner* train_ = nullptr;
  std::optional<int64_t> num_training_batches_;
  std::unique_ptr<AutomaticOptimization> optimization_;
  std::optional<ValidationSchedule> schedule_;
  torch::Tensor hook_loss_;  // Note [The hooks' loss]
};

}  // namespace fulgor::detail
