#include "loops/training_epoch_loop.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "loops/automatic_optimization.h"
#include "loops/context.h"
#include "loops/fit_loop.h"
#include "loops/signals.h"

// Note [The per-step path]
// On a small model LibTorch's own training step runs through some 3,800
// distinct 64-byte code lines, more than the first-level instruction cache
// holds and about what the second level has room for beside the data: it is
// bound by fetching its code. Every line the Trainer adds to a step then costs
// a cache miss or two at each step, tens of nanoseconds, far more than the
// instructions in it (measured with callgrind's cache simulation and the
// overhead benchmark, docs/benchmarks.md). So the per-step path is kept
// short in code lines: rare branches (ddp, accumulation, anomaly detection,
// clipping, stops, validation) are marked unlikely so that the compiler moves
// them out of the way, the checks of precision plugins and the progress bar
// are inline or come before any other work, log() finds its names in
// MetricTables (Note [Metric tables]), and batches a loader makes on the
// device already are not moved (TensorLoader::batches_on).
namespace fulgor::detail {

namespace {

// Note [The hooks' loss]
// The batch-end hooks get the loss without its graph, so that keeping it does
// not keep the step's autograd nodes alive. backward() has consumed the graph,
// so a shallow copy of the loss without autograd metadata serves as well as
// detach() at a fraction of its cost. When no hook kept the previous step's
// copy, its TensorImpl is refilled in place (what set_data does) instead of a
// new one being allocated: on a small model, each step's allocations are a
// noticeable part of the Trainer's own work.
void refill_graph_free(torch::Tensor& copy, const torch::Tensor& loss) {
  c10::TensorImpl* impl = copy.defined() ? copy.unsafeGetTensorImpl() : nullptr;
  const bool unshared = impl && copy.use_count() == 1 && copy.weak_use_count() == 1 && !impl->autograd_meta();
  if (unshared && impl->has_compatible_shallow_copy_type(loss.key_set()))
    impl->shallow_copy_from(loss.getIntrusivePtr());
  else
    copy = loss.variable_data();
}

}  // namespace

ValidationSchedule::ValidationSchedule(const LoopLimits& l, bool validating, std::optional<int64_t> train_batches)
    : validating_(validating), every_n_epoch_(l.check_val_every_n_epoch), train_batches_(train_batches) {
  const Limit& vci = l.val_check_interval;
  if (vci.is_count()) {
    every_ = vci.count();
  } else if (!vci.is_all()) {
    if (train_batches_)
      every_ = std::max<int64_t>(1, static_cast<int64_t>(std::floor(*train_batches_ * vci.fraction())));
    else if (validating_)
      throw ConfigError(
          fmt::format("val_check_interval={} is a fraction, but the training loader does not tell "
                      "its length: give a count of batches, or make the loader with "
                      "fulgor::make_data_loader",
                      vci.str()));
  }
}

TrainingEpochLoop::TrainingEpochLoop(LoopContext& state, FitLoop& fit)
    : val_loop(state, Stage::validate),
      s(state),
      fit_(fit),
      optimization_(std::make_unique<AutomaticOptimization>(state)) {}
TrainingEpochLoop::~TrainingEpochLoop() = default;

void TrainingEpochLoop::state_dict(nlohmann::json& loop) const {
  loop["global_step"] = global_step;
  loop["batches_in_epoch"] = batch_progress.current.processed;
  loop["total_train_batches"] = batch_progress.total.processed;
  if (s.manual) loop["batches_that_stepped"] = batches_that_stepped;
}

void TrainingEpochLoop::load_state_dict(const nlohmann::json& loop) {
  const auto in_epoch = loop.at("batches_in_epoch").get<int64_t>();
  batch_progress.current = {in_epoch, in_epoch, in_epoch, in_epoch};
  const auto total = loop.at("total_train_batches").get<int64_t>();
  batch_progress.total = {total, total, total, total};
  global_step = loop.at("global_step").get<int64_t>();
  batches_that_stepped = loop.value("batches_that_stepped", int64_t{0});
  s.metrics.log_step = logging_step();
}

void TrainingEpochLoop::reset_for_fit(StepRunner& train, StepRunner* val) {
  train_ = &train;
  val_loop.use(val);
  batch_progress = {};
  global_step = batches_that_stepped = 0;
  num_training_batches_.reset();
  schedule_.reset();
}

void TrainingEpochLoop::setup(std::optional<int64_t> num_training_batches) {
  num_training_batches_ = num_training_batches;
  schedule_.emplace(s.limits, val_loop.enabled(), num_training_batches);
}

void TrainingEpochLoop::reset(bool resuming, bool begun_there) {
  if (!resuming) batch_progress.reset_on_run();
  optimization_->window = 0;
  if (!resuming || begun_there) return;
  // A checkpoint may count more batches than this loader has.
  for (int64_t i = 0; i < batch_progress.current.processed; ++i)
    if (!train_->next(false)) {
      batch_progress.is_last_batch = true;
      break;
    }
}

bool TrainingEpochLoop::reached_last_batch() const {
  return batch_progress.is_last_batch ||
         (num_training_batches_ && batch_progress.current.ready >= *num_training_batches_);
}

void TrainingEpochLoop::step_epoch_schedulers(int64_t epochs) {
  optimization_->step_schedulers(Interval::epoch, epochs);
}

int64_t TrainingEpochLoop::logging_step() const { return s.manual ? batches_that_stepped : global_step; }

void TrainingEpochLoop::run() {
  while (!done()) {
    if (!advance()) break;
    on_advance_end();
    if (FULGOR_UNLIKELY(fit_.stopped_by_signal())) return;
  }
  on_run_end();
}

// Lightning's _TrainingEpochLoop.done: a stop asked for before min_epochs and
// min_steps are met waits for them, and says so.
bool TrainingEpochLoop::done() {
  if (reached_last_batch() || fit_.max_steps_reached()) return true;
  if (FULGOR_UNLIKELY(s.should_stop)) {
    if (fit_.can_stop_early()) return true;
    const auto& l = s.limits;
    s.info_once(
        fmt::format("Trainer was signaled to stop but the required `min_epochs={}` or `min_steps={}` has not been met. "
                    "Training will continue...",
                    l.min_epochs, l.min_steps ? std::to_string(*l.min_steps) : std::string("None")));
  }
  return false;
}

// One batch, with its hooks in Lightning's order. False when the epoch ends
// without it: the loader ran out, or on_train_batch_start returned -1.
bool TrainingEpochLoop::advance() {
  bool fetched;
  {
    ProfileScope timed(s.hooks.stage("[_TrainingEpochLoop].train_dataloader_next"));
    fetched = train_->next(true);
  }
  if (!fetched) {
    batch_progress.is_last_batch = true;
    return false;
  }
  ModuleBase& model = *s.module;
  const int64_t batch_idx = batch_progress.current.ready;
  batch_progress.increment_ready();
  s.metrics.current_batch_size = train_->batch_size();
  s.metrics.context = LogContext::train_step;
  // The epoch's last batch steps the optimizer even mid-window.
  const bool steps_optimizer = (batch_idx + 1) % s.accumulate_grad_batches == 0 || reached_last_batch();
  s.metrics.step_log_due =
      steps_optimizer && ((logging_step() + 1) % s.options.log_every_n_steps == 0 || s.should_stop);
  s.hooks.callbacks().on_train_batch_start(batch_idx);
  if (FULGOR_UNLIKELY(s.hooks.module("on_train_batch_start", [&] { return model.on_train_batch_start(batch_idx); }) ==
                      -1)) {
    s.metrics.context = LogContext::none;
    s.metrics.step_log_due = true;
    return false;
  }
  batch_progress.increment_started();
  // Note [The optimizer closure]
  const torch::Tensor loss = [&] {
    ProfileScope timed(s.hooks.stage("run_training_batch"));
    auto& o = *optimization_;
    if (FULGOR_UNLIKELY(s.manual)) return o.manual_step(*train_, batch_idx);
    return steps_optimizer ? o.optimizer_step(train_, batch_idx) : o.run_closure(*train_, batch_idx, false);
  }();
  batch_progress.increment_processed();
  // Note [The hooks' loss]
  if (loss.defined())
    refill_graph_free(hook_loss_, loss);
  else
    hook_loss_.reset();
  const BatchEnd end = batch_end(*train_, hook_loss_, batch_idx);
  s.hooks.callbacks().on_train_batch_end(end);
  s.hooks.module("on_train_batch_end", [&] { model.on_train_batch_end(hook_loss_, batch_idx); });
  train_->drop_batch();
  {
    ProfileScope timed(s.hooks.stage("[_LoggerConnector].update_train_step_metrics"));
    s.metrics.flush_step_logs();
  }
  s.metrics.context = LogContext::none;
  s.metrics.step_log_due = true;
  batch_progress.increment_completed();
  return true;
}

// Validation when it is due, or before a stop that can be honoured (as
// Lightning's _should_check_val_fx), then a signal's checkpoint.
void TrainingEpochLoop::on_advance_end() {
  const int64_t epoch = fit_.current_epoch();
  const bool stopping = FULGOR_UNLIKELY(s.should_stop) && fit_.can_stop_early() && schedule_->in_epoch(epoch);
  if (FULGOR_UNLIKELY(stopping ||
                      schedule_->due(epoch, batch_progress.current.processed, batch_progress.total.processed, false)))
    validate();
  s.metrics.log_step = logging_step();
  s.poll_checkpoint_write();  // Note [Asynchronous checkpoints]
  if (int sig = s.agree_on_stop(SignalTrap::pending()); FULGOR_UNLIKELY(sig != 0)) fit_.stop_for_signal(sig);
}

// The end of the batches: a loader that does not tell its length ends a
// window unannounced, whose gradients are stepped now, and then validates.
void TrainingEpochLoop::on_run_end() {
  auto& o = *optimization_;
  if (batch_progress.is_last_batch && o.window > 0) {
    if (s.ddp) s.ddp->reduce_gradients();
    o.optimizer_step(nullptr, batch_progress.current.processed - 1);
  }
  o.window = 0;
  s.metrics.log_step = logging_step();
  if (reached_last_batch() &&
      schedule_->due(fit_.current_epoch(), batch_progress.current.processed, batch_progress.total.processed, true))
    validate();
}

void TrainingEpochLoop::validate() {
  if (!val_loop.setup_data()) return;
  // Lightning frees the gradients first, unless they are still accumulating.
  if (batch_progress.current.processed % s.accumulate_grad_batches == 0 || reached_last_batch())
    s.hooks.module("on_validation_model_zero_grad", [&] { s.module->on_validation_model_zero_grad(); });
  val_loop.run();
}

}  // namespace fulgor::detail
