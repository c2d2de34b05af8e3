#pragma once

// What the tuner's sweeps (Lightning's tuner/) share: the Trainer's state,
// and a sweep's starting point saved and put back.

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loops/progress.h"
#include "trainer/state.h"

namespace fulgor::detail {

struct TrainerAccess {
  static TrainerState& state(Trainer& trainer) { return *trainer.state_; }
};

// Note [A sweep inside a fit]
// Lightning's lr_find and scale_batch_size run the fit loop inside the fit
// that is beginning (from on_fit_start), with their own callbacks, no
// loggers and their own limits, and then put back what the runs changed: a
// checkpoint saved first and restored after, the loops' counters from a
// copy. fulgor does the same. The checkpoint is fulgor's own, written into
// default_root_dir and removed; the counters are copied rather than read
// back from it, because a checkpoint's loop state is that of a resume; the
// metric tables the callbacks see are copied too; and, as Lightning's
// isolate_rng, the CPU's and the device's generators are put back, so that
// a fit that ran a sweep trains on exactly as one that did not.
class SweepScope {
 public:
  // Saves the starting point (`tag` names the checkpoint file) and sets the
  // sweep up: `callbacks` replace the Trainer's, the loggers and the
  // module's schedulers are set aside.
  SweepScope(TrainerState& s, const std::string& tag, std::vector<std::shared_ptr<Callback>> callbacks);
  ~SweepScope();
  SweepScope(const SweepScope&) = delete;
  SweepScope& operator=(const SweepScope&) = delete;

  // Back to the starting point: once, after the sweep or when it throws.
  void restore();
  // The fit loop's optimizer steps when the sweep began.
  int64_t start_step() const { return global_step_; }

 private:
  TrainerState& s;
  std::string path_;
  bool restored_ = false;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<std::shared_ptr<Logger>> loggers_;
  LoopLimits limits_;
  std::vector<SchedulerConfig> schedulers_;
  Progress epoch_progress_;
  BatchProgress batch_progress_;
  int64_t global_step_, batches_that_stepped_, log_step_;
  std::optional<int64_t> num_training_batches_;
  std::map<std::string, double> callback_metrics_, progress_bar_metrics_, logged_metrics_;
  RunningStage running_;
  bool should_stop_, training_;
  std::string stop_reason_;
  torch::Tensor cpu_rng_, device_rng_;
};

// Runs `sweep` within a SweepScope, restoring also when it throws.
template <typename Sweep>
void run_sweep(SweepScope& scope, Sweep&& sweep) {
  try {
    sweep();
  } catch (...) {
    scope.restore();
    throw;
  }
  scope.restore();
}

}  // namespace fulgor::detail
