#pragma once

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "fulgor/loops/fit_result.h"
#include "loops/progress.h"
#include "loops/training_epoch_loop.h"

namespace fulgor::detail {

struct LoopContext;
struct LoadedCheckpoint;

// Lightning's _FitLoop: the epochs of a fit. run() is setup_data, then (unless
// there is nothing to train) on-run-start, an epoch (on-advance-start,
// advance, on-advance-end) until done, and on-run-end. Its state is the
// epochs' progress: Trainer::current_epoch() is the epochs completed.
class FitLoop {
 public:
  explicit FitLoop(LoopContext& state) : epoch_loop(state, *this), s(state) {}

  // A new fit over `train`, validating on `val` (nullptr: none).
  void reset_for_fit(StepRunner& train, StepRunner* val);
  // The loops' state as a checkpoint keeps it (Note [The loops' state in a
  // checkpoint]).
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& loop);
  // A resume from `ckpt`, which must outlive the fit: its generator states
  // are restored as the first epoch begins (Note [Resuming mid-epoch] in
  // fit_loop.cpp).
  void resume_from(LoadedCheckpoint& ckpt) { resume_ = &ckpt; }
  // Whether the fit resumes in the middle of an epoch, or by steps: it then
  // skips the sanity check (Lightning's FitLoop.restarting).
  bool restarting() const;
  // Forgets the checkpoint resume_from was given: the tuner restores a
  // sweep's starting point with it, which is no resume.
  void forget_resume() { resume_ = nullptr; }
  void run();
  // Lightning's FitLoop.setup_data: the training loader (a data module's or
  // the module's is asked for now), its device and shard, and its batches
  // per epoch after limits. run() begins with it; BatchSizeFinder calls it
  // to see a loader made at a new batch size.
  void setup_data();
  // The training loader of the fit.
  StepRunner* train_runner() const { return train_; }
  // The result fit returns once run() has.
  FitResult result() const;

  int64_t current_epoch() const { return epoch_progress.current.completed; }
  // Lightning's _can_stop_early: a stop waits for min_epochs and min_steps.
  bool can_stop_early() const;
  bool max_steps_reached() const;
  // Saves last.ckpt and ends the fit after this batch (SIGINT, SIGTERM).
  void stop_for_signal(int signal);
  bool stopped_by_signal() const { return signaled_; }

  // Training batches per epoch after limits (nullopt: the loader does not tell).
  std::optional<int64_t> num_training_batches;
  Progress epoch_progress;
  TrainingEpochLoop epoch_loop;
  // The CPU generator's state when the current epoch began, which shuffled
  // its batches: a checkpoint saved mid-epoch keeps it (Note [Resuming
  // mid-epoch] in fit_loop.cpp).
  torch::Tensor rng_epoch_start;

 private:
  bool done();
  void on_run_start();
  void on_advance_start();
  void on_advance_end();
  void on_run_end();
  void stop(StopReason reason, std::string message);

  LoopContext& s;
  StepRunner* train_ = nullptr;
  int64_t train_reloaded_in_epoch_ = 0;  // the epoch setup_data last ran in
  // The checkpoint the fit resumes from, until its first epoch has begun.
  LoadedCheckpoint* resume_ = nullptr;
  StopReason reason_ = StopReason::max_epochs;
  std::string message_, signal_checkpoint_;
  bool signaled_ = false;
};

}  // namespace fulgor::detail
