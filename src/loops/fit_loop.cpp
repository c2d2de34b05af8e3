#include "loops/fit_loop.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <filesystem>

#include "checkpoint/rng.h"
#include "loops/context.h"

namespace fulgor {

std::string to_string(StopReason reason) {
  switch (reason) {
    case StopReason::max_epochs:
      return "max_epochs";
    case StopReason::max_steps:
      return "max_steps";
    case StopReason::requested:
      return "requested";
    case StopReason::signal:
      return "signal";
  }
  return "unknown";
}

namespace detail {

void FitLoop::reset_for_fit(StepRunner& train, StepRunner* val) {
  train_ = &train;
  epoch_loop.reset_for_fit(train, val);
  epoch_progress = {};
  num_training_batches.reset();
  resume_ = nullptr;
  reason_ = StopReason::max_epochs;
  message_.clear();
  signal_checkpoint_.clear();
  signaled_ = false;
  rng_epoch_start = torch::Tensor();
}

// Note [The loops' state in a checkpoint]
// A checkpoint keeps the loops' progress as the counters a resume needs:
// the epochs completed, whether the last one was processed (a checkpoint
// saved by its end hooks), the batches processed in the epoch and in the
// fit, the optimizer steps and, under manual optimization, the batches run.
// Every counter of the loops follows from these, as Lightning's
// reset_on_restart makes them: a unit begun but unfinished is counted as
// begun, so that restarting() and a mid-epoch resume read it from them.
// Each loop writes and reads its own counters, the fit loop's taking in its
// epoch loop's as Lightning's _Loop.state_dict does, in the one object of
// fulgor's format: "epoch" and "epoch_finished" are the fit loop's, the
// others the training epoch loop's.
nlohmann::json FitLoop::state_dict() const {
  nlohmann::json loop = {{"epoch", current_epoch()}, {"epoch_finished", epoch_progress.unit_ending()}};
  epoch_loop.state_dict(loop);
  return loop;
}

void FitLoop::load_state_dict(const nlohmann::json& loop) {
  epoch_loop.load_state_dict(loop);
  const auto epoch = loop.at("epoch").get<int64_t>();
  epoch_progress.current = {epoch, epoch, epoch, epoch};
  if (loop.at("epoch_finished").get<bool>())
    epoch_progress.current = {epoch + 1, epoch + 1, epoch + 1, epoch};
  else if (epoch_loop.batch_progress.current.processed > 0)
    epoch_progress.current = {epoch + 1, epoch + 1, epoch, epoch};
  epoch_progress.total = epoch_progress.current;
}

bool FitLoop::restarting() const {
  return resume_ != nullptr && (epoch_progress.unit_unfinished() || s.limits.max_steps != -1);
}

bool FitLoop::can_stop_early() const {
  const auto& l = s.limits;
  return epoch_progress.current.processed >= l.min_epochs && epoch_loop.global_step >= l.min_steps.value_or(0);
}

bool FitLoop::max_steps_reached() const {
  return s.limits.max_steps != -1 && epoch_loop.global_step >= s.limits.max_steps;
}

void FitLoop::run() {
  setup_data();
  if (done()) return;  // Lightning's skip: nothing to train, or a resumed fit that is done
  on_run_start();
  while (!done()) {
    on_advance_start();
    {
      ProfileScope timed(s.hooks.stage("run_training_epoch"));
      epoch_loop.run();
    }
    if (signaled_) break;
    on_advance_end();
  }
  on_run_end();
}

void FitLoop::setup_data() {
  train_reloaded_in_epoch_ = current_epoch();
  s.open_loader(*train_, Stage::train);
  train_->bind(*s.accelerator, s.device_setup->device, s.precision.precision());
  s.distribute(*train_, /*even=*/true);
  s.warn_if_empty(*train_, Stage::train);
  const auto& l = s.limits;
  if (l.overfit) {
    num_training_batches = LoopContext::resolve_limit(l.limit_train_batches, *train_, "overfit_batches");
    stop_shuffling(s, *train_, "train");
    // Note [Overfitting a loader that shuffles] in inference_loop.cpp
    train_->cache_first(*num_training_batches);
  } else {
    num_training_batches = LoopContext::resolve_limit(l.limit_train_batches, *train_, "limit_train_batches");
  }
  epoch_loop.setup(num_training_batches);
  if (!s.loggers.empty() && num_training_batches && *num_training_batches < s.options.log_every_n_steps)
    s.warn(
        fmt::format("The number of training batches ({}) is smaller than the logging interval "
                    "Trainer(log_every_n_steps={}). Set a lower value for log_every_n_steps if you want to see "
                    "logs for the training epoch.",
                    *num_training_batches, s.options.log_every_n_steps));
}

void FitLoop::stop(StopReason reason, std::string message) {
  reason_ = reason;
  message_ = std::move(message);
}

// Lightning's FitLoop.done, with its messages.
bool FitLoop::done() {
  if (signaled_) return true;
  if (num_training_batches == 0) {
    stop(StopReason::max_epochs, "`Trainer.fit` stopped: No training batches.");
    return true;
  }
  const auto& l = s.limits;
  if (max_steps_reached()) {
    stop(StopReason::max_steps, fmt::format("`Trainer.fit` stopped: `max_steps={}` reached.", l.max_steps));
    s.info(message_);
    return true;
  }
  if (l.max_epochs != -1 && epoch_progress.current.processed >= l.max_epochs) {
    epoch_progress.current.completed = epoch_progress.current.processed;
    stop(StopReason::max_epochs, fmt::format("`Trainer.fit` stopped: `max_epochs={}` reached.", l.max_epochs));
    s.info(message_);
    return true;
  }
  if (s.should_stop && can_stop_early()) {
    stop(StopReason::requested, s.stop_reason.empty() ? "stop requested" : s.stop_reason);
    return true;
  }
  return false;
}

// Lightning's FitLoop.on_run_start: the validation loader is set up now when
// the first epoch validates, so that num_val_batches is known from the start.
void FitLoop::on_run_start() {
  // A checkpoint saved as an epoch ended resumes at the next one.
  if (epoch_progress.unit_ending()) epoch_progress.current.completed = epoch_progress.current.processed;
  auto& val = epoch_loop.val_loop;
  if (val.enabled() && epoch_loop.schedule().in_epoch(current_epoch())) val.setup_data();
  s.module->train();
  s.hooks.both("on_train_start", &Callback::on_train_start, &ModuleBase::on_train_start);
}

// Lightning's FitLoop.on_advance_start. Note [Resuming mid-epoch]
// A shuffling sampler draws its order from the CPU generator when the epoch
// begins. The checkpoint holds that generator's state from the epoch's start
// as well as its current state: the epoch is begun again from the first, the
// batches already trained on are fetched and dropped (or, by a loader with
// start_at, not made at all), and then the current state is put back. Lightning does not start again an epoch resumed
// in its middle: its start hooks are not called.
void FitLoop::on_advance_start() {
  // Lightning's _should_reload_train_dl; a loader given to fit is the same
  // object again, so only a made one is asked for anew.
  const int64_t reload_every = s.options.reload_dataloaders_every_n_epochs;
  if (reload_every > 0 && !train_->source_name().empty() &&
      current_epoch() - train_reloaded_in_epoch_ >= reload_every)
    setup_data();
  const bool resuming = epoch_progress.unit_unfinished();
  s.running = RunningStage::training;
  s.metrics.train_accumulators.clear();
  s.module->train();
  if (!resuming) {
    epoch_progress.increment_ready();
    s.hooks.both("on_train_epoch_start", &Callback::on_train_epoch_start, &ModuleBase::on_train_epoch_start);
    epoch_progress.increment_started();
  }
  if (resume_) restore_rng(*resume_, resuming ? "rng_epoch_start" : "rng_cpu", *s.accelerator, s.device_setup->device);
  rng_epoch_start = cpu_rng_state();
  train_->set_epoch(current_epoch());  // Note [Loader epochs] in step_runner.h
  // A loader that can begin mid-epoch skips the batches trained on unmade.
  const bool begun_there = resuming && train_->start_at(epoch_loop.batch_progress.current.processed);
  train_->start_epoch();
  epoch_loop.reset(resuming, begun_there);
  if (resume_ && resuming) restore_rng(*resume_, "rng_cpu", *s.accelerator, s.device_setup->device);
  resume_ = nullptr;
}

// Lightning's FitLoop.on_advance_end: the non-monitoring callbacks' hook,
// the module's, then the monitoring callbacks' (ModelCheckpoint's and
// EarlyStopping's), seeing the epoch's values; the loggers get them at the
// epoch's last step label. Between epochs the state is "at the start of the
// next one"; an epoch that a stop cut short counts as done, as Lightning's.
void FitLoop::on_advance_end() {
  ModuleBase& model = *s.module;
  s.running = RunningStage::training;
  epoch_progress.increment_processed();
  s.metrics.refresh(s.metrics.train_accumulators);
  s.metrics.context = LogContext::train_epoch;
  s.hooks.callbacks().on_train_epoch_end(Hooks::Which::not_monitoring);
  s.hooks.module("on_train_epoch_end", [&] { model.on_train_epoch_end(); });
  s.metrics.context = LogContext::none;
  s.metrics.refresh(s.metrics.train_accumulators);
  // Under manual optimization the module steps its schedulers.
  if (epoch_loop.reached_last_batch() && !s.manual) epoch_loop.step_epoch_schedulers(epoch_progress.current.processed);
  s.hooks.callbacks().on_train_epoch_end(Hooks::Which::monitoring);
  {
    ProfileScope timed(s.hooks.stage("[_LoggerConnector].update_train_epoch_metrics"));
    s.metrics.aggregate(s.metrics.train_accumulators, s.metrics.log_step - 1);  // Note [Logged steps]
  }
  epoch_progress.increment_completed();
  epoch_loop.batch_progress.reset_on_run();
  s.agree_on_stop(0);
}

void FitLoop::on_run_end() {
  s.running = RunningStage::none;
  s.hooks.both("on_train_end", &Callback::on_train_end, &ModuleBase::on_train_end);
}

void FitLoop::stop_for_signal(int signal) {
  signaled_ = true;
  reason_ = StopReason::signal;
  message_ = fmt::format("stopped by signal {} ({})", signal, signal == SIGINT ? "SIGINT" : "SIGTERM");
  signal_checkpoint_ = (std::filesystem::path(s.checkpoint_dir()) / "last.ckpt").string();
  ProfileScope timed(s.hooks.stage("save_checkpoint"));
  s.save_checkpoint(signal_checkpoint_);
}

FitResult FitLoop::result() const {
  FitResult result;
  result.reason = reason_;
  result.message = message_;
  result.epochs_completed = current_epoch();
  result.global_step = epoch_loop.global_step;
  result.checkpoint_path = signal_checkpoint_;
  return result;
}

}  // namespace detail
}  // namespace fulgor
