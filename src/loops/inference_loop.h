#pragma once

#include <torch/types.h>

#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "fulgor/loops/step_runner.h"
#include "loops/progress.h"

namespace fulgor::detail {

struct LoopContext;

// Turns off a loader's shuffling for overfit_batches, with Lightning's
// warning naming the loader by `prefix` ("train", "val").
void stop_shuffling(LoopContext& s, StepRunner& runner, const char* prefix);

// Lightning's _no_grad_context around an evaluation or prediction run:
// torch::InferenceMode, or NoGradGuard where inference tensors would not do.
class NoGradContext {
 public:
  explicit NoGradContext(bool inference) : grad_enabled_before_(c10::GradMode::is_enabled()) {
    if (inference)
      inference_.emplace();
    else
      c10::GradMode::set_enabled(false);
  }
  ~NoGradContext() {
    inference_.reset();
    c10::GradMode::set_enabled(grad_enabled_before_);
  }
  NoGradContext(const NoGradContext&) = delete;
  NoGradContext& operator=(const NoGradContext&) = delete;

 private:
  // NoGradGuard's work written out: g++ 12 takes an optional NoGradGuard's
  // saved mode for uninitialized (-Wmaybe-uninitialized).
  bool grad_enabled_before_;
  std::optional<c10::InferenceMode> inference_;
};

// What Lightning's _EvaluationLoop and _PredictionLoop share: a loader set up
// once per loop, its batches limited, and one pass over them with the
// stage's batch hooks around each step.
class InferenceLoop {
 public:
  InferenceLoop(LoopContext& state, Stage stage) : s(state), stage_(stage) {}

  // The loader of the loops to come (nullptr: none); its data is set up anew.
  void use(StepRunner* runner);
  // Lightning's setup_data: the first call takes the loader (a data module's
  // or the module's is asked for now), gives it the device and this rank's
  // shard, and resolves max_batches. False when there is no loader. Fit's
  // validation loop takes it again every reload_dataloaders_every_n_epochs.
  bool setup_data();
  // Whether the loop has a loader, as far as is known before it is set up.
  bool has_loader() const { return runner_ != nullptr && !(set_up_ && !opened_); }

  // Batches a run goes through after limits (nullopt: all); known once set up.
  std::optional<int64_t> max_batches;
  // Batches the running (or last) run goes through: max_batches, or fewer in
  // a sanity check (Trainer::num_eval_batches).
  std::optional<int64_t> batches_this_run;
  BatchProgress batch_progress;
  Stage stage() const { return stage_; }

 protected:
  // Whether a run uses torch::InferenceMode: with the option on, outside fit
  // (whose validation Lightning runs under no_grad) and not under ddp on
  // gloo, as Lightning's _no_grad_context.
  bool inference_mode() const;
  // One pass over the loader, at most `limit` batches; predict_step's
  // outputs into `outputs` when given.
  void run_batches(std::optional<int64_t> limit, std::vector<torch::Tensor>* outputs);
  // The loop's hooks without arguments, for the callbacks and the module.
  enum Point { kStart, kEpochStart, kEpochEnd, kEnd };
  void hook(Point point);

  LoopContext& s;

 private:
  void batch_hook(bool start, int64_t i, const torch::Tensor& out);
  bool reload_due() const;

  Stage stage_;
  StepRunner* runner_ = nullptr;
  bool set_up_ = false, opened_ = false;
  int64_t reloaded_in_epoch_ = 0;  // the fit's epoch it was set up in
};

}  // namespace fulgor::detail
