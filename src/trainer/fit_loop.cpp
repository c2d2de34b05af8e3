#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>

#include "fulgor/callbacks/early_stopping.h"
#include "fulgor/callbacks/model_checkpoint.h"
#include "signals.h"
#include "state.h"
#include "training_batch.h"

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

// Note [Overfitting a loader that shuffles]
// overfit_batches trains and validates on the first batches of the loaders
// with their shuffling turned off, as Lightning's _resolve_overfit_batches
// does. Only a loader that offers it (TensorLoader::disable_shuffle) can be
// told; any other keeps its order, and the first epoch's first batches are
// kept and replayed in every later epoch, so that it still trains on the
// same batches throughout.
void stop_shuffling(StepRunner& runner, const char* which) {
  if (runner.disable_shuffle())
    TORCH_WARN("You requested to overfit but enabled ", which, " dataloader shuffling. We are turning off the ", which,
               " dataloader shuffling for you.");
}

// When fit validates (Lightning's _should_check_val_fx): in every
// check_val_every_n_epoch-th epoch, after every val_check_interval training
// batches (counted within the epoch when check_val_every_n_epoch is set,
// across epochs otherwise), or, with the default interval, once per epoch
// after its last batch.
class ValidationSchedule {
 public:
  ValidationSchedule(const TrainerOptions& o, bool validating, std::optional<int64_t> train_batches)
      : validating_(validating),
        fast_dev_run_(o.fast_dev_run > 0),
        every_n_epoch_(o.check_val_every_n_epoch),
        train_batches_(train_batches) {
    const Limit& vci = fast_dev_run_ ? Limit(1.0) : o.val_check_interval;
    if (!validating_) return;
    if (vci.is_count()) {
      every_ = vci.count();
    } else if (!vci.is_all()) {
      if (!train_batches_)
        throw ConfigError(
            fmt::format("val_check_interval={} is a fraction, but the training loader does not tell "
                        "its length: give a count of batches, or make the loader with "
                        "fulgor::make_data_loader",
                        vci.str()));
      every_ = std::max<int64_t>(1, static_cast<int64_t>(std::floor(*train_batches_ * vci.fraction())));
    }
  }

  // Whether to validate in `epoch` after `done_in_epoch` batches
  // (`total` in the fit), or at the epoch's end.
  bool due(int64_t epoch, int64_t done_in_epoch, int64_t total, bool epoch_end) const {
    if (!validating_) return false;
    if (!fast_dev_run_ && every_n_epoch_ && (epoch + 1) % *every_n_epoch_ != 0) return false;
    if (every_) {
      if (epoch_end) return false;
      const int64_t counter = every_n_epoch_ ? done_in_epoch : total;
      return counter % *every_ == 0;
    }
    // Once per epoch, after its last batch.
    if (train_batches_) return !epoch_end && done_in_epoch == *train_batches_;
    return epoch_end;
  }

 private:
  bool validating_, fast_dev_run_;
  std::optional<int64_t> every_n_epoch_, train_batches_;
  std::optional<int64_t> every_;  // validate after every N training batches
};

// Lightning's FitLoop.on_advance_end: the non-monitoring callbacks' hook,
// the module's, then ModelCheckpoint's and EarlyStopping's, seeing the
// epoch's values; the loggers get them at the epoch's last step label.
void train_epoch_end(TrainerState& s, TrainingBatch& batch, ModuleBase& model, bool complete) {
  s.loop = "train";
  s.epoch_finished = true;  // as Lightning's epoch_progress.processed
  s.metrics.refresh(s.metrics.train_accumulators);
  const auto monitoring = [](const Callback& cb) {
    return dynamic_cast<const ModelCheckpoint*>(&cb) != nullptr || dynamic_cast<const EarlyStopping*>(&cb) != nullptr;
  };
  s.metrics.context = LogContext::train_epoch;
  s.each_callback("on_train_epoch_end", [&](Callback& cb) {
    if (!monitoring(cb)) cb.on_train_epoch_end(s.trainer, model);
  });
  s.call_module("on_train_epoch_end", [&] { model.on_train_epoch_end(); });
  s.metrics.context = LogContext::none;
  s.metrics.refresh(s.metrics.train_accumulators);
  // Under manual optimization the module steps its schedulers.
  if (complete && !s.manual) batch.step_schedulers(Interval::epoch, s.epoch + 1);
  s.each_callback("on_train_epoch_end", [&](Callback& cb) {
    if (monitoring(cb)) cb.on_train_epoch_end(s.trainer, model);
  });
  ProfileScope timed(s.profile("[_LoggerConnector].update_train_epoch_metrics"));
  s.metrics.aggregate(s.metrics.train_accumulators, s.metrics.log_step - 1);  // Note [Logged steps]
}

// Lightning's FitLoop._can_stop_early: a stop waits for min_epochs and
// min_steps (min_steps alone asks for one epoch, as _parse_loop_limits).
bool can_stop_early(const TrainerState& s) {
  const int64_t min_epochs = s.options.min_epochs.value_or(s.options.min_steps ? 1 : 0);
  return s.epoch >= min_epochs && s.global_step >= s.options.min_steps.value_or(0);
}

}  // namespace
}  // namespace fulgor::detail

namespace fulgor {

using detail::LogContext;
using detail::Stage;

FitResult Trainer::run_fit(ModuleBase& model, detail::StepRunner& train, detail::StepRunner* val,
                           const FitOptions& fit_options, DataModuleBase* datamodule) {
  auto& s = *state_;
  const auto& o = s.options;
  s.begin("fit");
  s.datamodule = datamodule;
  // Read the checkpoint before anything is written, so a bad one changes nothing.
  std::optional<detail::LoadedCheckpoint> ckpt;
  if (!fit_options.ckpt_path.empty()) ckpt = s.checkpoints.read(fit_options.ckpt_path);

  struct Scope {
    detail::TrainerState& s;
    ~Scope() { s.end(); }
  } scope{s};

  FitResult result;
  detail::TrainingBatch batch(s);
  try {
    // Lightning's Trainer._run, in its order.
    s.attach(model);
    s.attach_model_callbacks(model);
    s.setup_hooks(model, "fit");
    if (ckpt) s.checkpoints.restore_module_and_callbacks(*ckpt);
    s.configure_optimizers(model);
    s.manual_optimization.attach(model, true);
    s.epoch = s.global_step = s.manual_batches = s.metrics.log_step = s.batches_in_epoch = s.total_train_batches = 0;
    s.epoch_finished = false;
    s.checkpoints.rng_epoch_start = torch::Tensor();
    if (s.ddp) s.ddp->attach(model);
    detail::SignalTrap trap;
    s.each_callback("on_fit_start", [&](Callback& cb) { cb.on_fit_start(*this, model); });
    s.call_module("on_fit_start", [&] { model.on_fit_start(); });
    const nlohmann::json hparams = s.logged_hparams(model);
    for (auto& logger : s.loggers) logger->log_hyperparams(hparams);
    if (ckpt) s.checkpoints.restore_training_state(*ckpt);
    const int64_t max_steps = o.fast_dev_run > 0 ? o.fast_dev_run : o.max_steps;
    // A checkpoint from the middle of an epoch (or any, when training by
    // max_steps) resumes a restarting loop, which skips the sanity check
    // (Lightning's FitLoop.restarting).
    bool resuming_mid_epoch = ckpt && !s.epoch_finished && s.batches_in_epoch > 0;
    const bool restarting = resuming_mid_epoch || (ckpt && max_steps != -1);
    // A data module's loaders are asked for now, validation's first when a
    // sanity check will run, as Lightning's loops set up their data; without
    // a val_loader it does not validate.
    if (datamodule) {
      const bool sanity_first = o.num_sanity_val_steps != 0 && !restarting;
      if (sanity_first && val && !val->open()) val = nullptr;
      s.open_loader(train, Stage::train);
      if (!sanity_first && val && !val->open()) val = nullptr;
    }
    train.bind(*s.accelerator, *s.device, s.precision.precision());
    if (val) val->bind(*s.accelerator, *s.device, s.precision.precision());
    // Batches per epoch.
    if (o.fast_dev_run > 0) {
      s.train_batches = train.length() ? std::min(o.fast_dev_run, *train.length()) : o.fast_dev_run;
    } else if (o.overfit_batches.of(std::nullopt) != 0) {
      s.train_batches = detail::TrainerState::resolve_limit(o.overfit_batches, train, "overfit_batches");
      detail::stop_shuffling(train, "training");
      // Note [Overfitting a loader that shuffles]
      train.cache_first(*s.train_batches);
      if (val) detail::stop_shuffling(*val, "validation");
    } else {
      s.train_batches = detail::TrainerState::resolve_limit(o.limit_train_batches, train, "limit_train_batches");
    }
    detail::StepRunner* val_runner = val;
    std::optional<int64_t> val_limit;  // overfit_batches limits it too (eval_limit)
    if (val_runner) val_limit = s.eval_limit(Stage::validate, *val_runner);
    const bool validating = val_runner && val_limit != 0;
    const detail::ValidationSchedule schedule(o, validating, s.train_batches);

    model.zero_grad();
    if (validating && !restarting) s.evaluation.sanity_check(*val_runner, val_limit);

    model.train();
    s.each_callback("on_train_start", [&](Callback& cb) { cb.on_train_start(*this, model); });
    s.call_module("on_train_start", [&] { model.on_train_start(); });

    const int64_t accumulate = o.accumulate_grad_batches;
    bool first_after_resume = ckpt.has_value();
    if (ckpt && s.epoch_finished) ++s.epoch;
    result.reason = StopReason::max_epochs;
    torch::Tensor hook_loss;  // Note [The hooks' loss]
    bool stopped = false;
    while (!stopped) {
      if (s.max_epochs != -1 && s.epoch >= s.max_epochs) {
        result.reason = StopReason::max_epochs;
        break;
      }
      if (max_steps != -1 && s.global_step >= max_steps) {
        result.reason = StopReason::max_steps;
        break;
      }
      // A stop asked for before min_epochs or min_steps stands until they are done.
      if (s.should_stop && detail::can_stop_early(s)) {
        result.reason = StopReason::requested;
        break;
      }
      const int64_t skip = resuming_mid_epoch ? s.batches_in_epoch : 0;
      s.epoch_finished = false;
      s.batches_in_epoch = skip;  // a resumed epoch's hooks see the batches done before
      batch.window = 0;
      s.loop = "train";
      s.metrics.train_accumulators.clear();
      model.train();
      // Lightning does not start again an epoch resumed in its middle.
      if (!resuming_mid_epoch) {
        s.each_callback("on_train_epoch_start", [&](Callback& cb) { cb.on_train_epoch_start(*this, model); });
        s.call_module("on_train_epoch_start", [&] { model.on_train_epoch_start(); });
      }

      // Note [Resuming mid-epoch]
      // A shuffling sampler draws its order from the CPU generator when the
      // epoch begins. The checkpoint holds that generator's state from the
      // epoch's start as well as its current state: the epoch is begun again
      // from the first, the batches already trained on are fetched and
      // dropped, and then the current state is put back.
      if (first_after_resume && resuming_mid_epoch)
        s.checkpoints.restore_rng(*ckpt, "rng_epoch_start");
      else if (first_after_resume)
        s.checkpoints.restore_rng(*ckpt, "rng_cpu");
      s.checkpoints.rng_epoch_start = detail::cpu_rng_state();
      train.set_epoch(s.epoch);  // Note [Loader epochs] in trainer.h
      train.start_epoch();
      bool exhausted = false;
      // A checkpoint may count more batches than this loader has.
      for (int64_t i = 0; i < skip && !exhausted; ++i)
        if (!train.next(false)) exhausted = true;
      if (first_after_resume && resuming_mid_epoch) s.checkpoints.restore_rng(*ckpt, "rng_cpu");
      first_after_resume = resuming_mid_epoch = false;

      bool broke_early = false, skipped_rest = false;
      // Lightning's run_training_epoch: the batches and the validation they
      // lead to, not the epoch's start and end hooks.
      std::optional<detail::ProfileScope> timed_epoch;
      timed_epoch.emplace(s.profile("run_training_epoch"));
      while (!exhausted) {
        if (s.train_batches && s.batches_in_epoch >= *s.train_batches) break;
        bool fetched;
        {
          detail::ProfileScope timed(s.profile("[_TrainingEpochLoop].train_dataloader_next"));
          fetched = train.next(true);
        }
        if (!fetched) {
          exhausted = true;
          break;
        }
        const int64_t batch_idx = s.batches_in_epoch;
        // The epoch's last batch steps the optimizer even mid-window.
        const bool last = s.train_batches && batch_idx + 1 == *s.train_batches;
        s.metrics.current_batch_size = train.batch_size();
        s.metrics.context = LogContext::train_step;
        const bool steps_optimizer = (batch_idx + 1) % accumulate == 0 || last;
        s.metrics.step_log_due =
            steps_optimizer && ((s.logging_step() + 1) % o.log_every_n_steps == 0 || s.should_stop);
        s.each_callback("on_train_batch_start",
                        [&](Callback& cb) { cb.on_train_batch_start(*this, model, batch_idx); });
        if (FULGOR_UNLIKELY(
                s.call_module("on_train_batch_start", [&] { return model.on_train_batch_start(batch_idx); }) == -1)) {
          s.metrics.context = LogContext::none;
          s.metrics.step_log_due = true;
          skipped_rest = true;
          break;
        }
        // Note [The optimizer closure]
        const torch::Tensor loss = [&] {
          detail::ProfileScope timed(s.profile("run_training_batch"));
          if (FULGOR_UNLIKELY(s.manual)) return batch.manual_step(train, batch_idx);
          return steps_optimizer ? batch.optimizer_step(&train, batch_idx) : batch.run_closure(train, batch_idx, false);
        }();
        s.batches_in_epoch = batch_idx + 1;
        ++s.total_train_batches;
        // Note [The hooks' loss]
        if (loss.defined())
          detail::refill_graph_free(hook_loss, loss);
        else
          hook_loss.reset();
        s.each_callback("on_train_batch_end",
                        [&](Callback& cb) { cb.on_train_batch_end(*this, model, hook_loss, batch_idx); });
        s.call_module("on_train_batch_end", [&] { model.on_train_batch_end(hook_loss, batch_idx); });
        {
          detail::ProfileScope timed(s.profile("[_LoggerConnector].update_train_step_metrics"));
          s.metrics.flush_step_logs();
        }
        s.metrics.context = LogContext::none;
        s.metrics.step_log_due = true;

        if (FULGOR_UNLIKELY(schedule.due(s.epoch, s.batches_in_epoch, s.total_train_batches, false)))
          s.evaluation.run(*val_runner, Stage::validate, val_limit);
        s.metrics.log_step = s.logging_step();
        if (int sig = s.agree_on_stop(detail::SignalTrap::pending()); FULGOR_UNLIKELY(sig != 0)) {
          result.reason = StopReason::signal;
          result.message = fmt::format("stopped by signal {} ({})", sig, sig == SIGINT ? "SIGINT" : "SIGTERM");
          result.checkpoint_path = (std::filesystem::path(checkpoint_dir()) / "last.ckpt").string();
          detail::ProfileScope timed(s.profile("save_checkpoint"));
          s.checkpoints.save(result.checkpoint_path);
          stopped = true;
          break;
        }
        if (FULGOR_UNLIKELY(max_steps != -1 && s.global_step >= max_steps)) {
          broke_early = !(s.train_batches && s.batches_in_epoch == *s.train_batches);
          if (broke_early) result.reason = StopReason::max_steps;
          break;
        }
        if (FULGOR_UNLIKELY(s.should_stop && detail::can_stop_early(s))) {
          broke_early = !(s.train_batches && s.batches_in_epoch == *s.train_batches);
          if (broke_early) result.reason = StopReason::requested;
          break;
        }
      }
      if (stopped) break;
      // A loader that does not tell its length ends a window unannounced:
      // its gradients are stepped now.
      if (exhausted && batch.window > 0) {
        if (s.ddp) s.ddp->reduce_gradients();
        batch.optimizer_step(nullptr, s.batches_in_epoch - 1);
      }
      batch.window = 0;
      s.metrics.log_step = s.logging_step();
      const bool complete = !broke_early;
      if (complete && !skipped_rest && schedule.due(s.epoch, s.batches_in_epoch, s.total_train_batches, true))
        s.evaluation.run(*val_runner, Stage::validate, val_limit);
      timed_epoch.reset();
      detail::train_epoch_end(s, batch, model, complete);
      s.agree_on_stop(0);
      // Between epochs the state is "at the start of the next one"; an epoch
      // that a stop cut short counts as done, as Lightning's epoch progress.
      ++s.epoch;
      s.batches_in_epoch = 0;
      s.epoch_finished = false;
      if (!complete) break;
    }
    if (result.message.empty()) {
      switch (result.reason) {
        case StopReason::max_epochs:
          result.message = fmt::format("max_epochs={} reached", s.max_epochs);
          break;
        case StopReason::max_steps:
          result.message = fmt::format("max_steps={} reached", max_steps);
          break;
        case StopReason::requested:
          result.message = s.stop_reason.empty() ? "stop requested" : s.stop_reason;
          break;
        case StopReason::signal:
          break;
      }
    }
    s.loop.clear();
    s.each_callback("on_train_end", [&](Callback& cb) { cb.on_train_end(*this, model); });
    s.call_module("on_train_end", [&] { model.on_train_end(); });
    s.each_callback("on_fit_end", [&](Callback& cb) { cb.on_fit_end(*this, model); });
    s.call_module("on_fit_end", [&] { model.on_fit_end(); });
    s.teardown_hooks(model, "fit");
    for (auto& logger : s.loggers) logger->finalize(result.reason == StopReason::signal ? "interrupted" : "success");
    s.describe_profile("fit");
  } catch (const std::exception& e) {
    s.on_exception(model, e);
    throw;
  }
  result.epochs_completed = s.epoch;
  result.global_step = s.global_step;
  return result;
}

}  // namespace fulgor
