#include "loops/inference_loop.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "fulgor/distributed/strategy.h"
#include "loops/context.h"
#include "loops/fit_loop.h"

namespace fulgor::detail {

namespace {

struct LoopHook {
  const char* name;
  void (Callback::*callback)(Trainer&, ModuleBase&);
  void (ModuleBase::*module)();
};

const char* limit_name(Stage stage) {
  return stage == Stage::validate ? "limit_val_batches"
         : stage == Stage::test   ? "limit_test_batches"
                                  : "limit_predict_batches";
}

}  // namespace

// Note [Overfitting a loader that shuffles]
// overfit_batches trains and validates on the first batches of the loaders
// with their shuffling turned off, as Lightning's _resolve_overfit_batches
// does. Only a loader that offers it (TensorLoader::disable_shuffle) can be
// told; any other keeps its order, and the first epoch's first batches are
// kept and replayed in every later epoch, so that it still trains on the
// same batches throughout.
void stop_shuffling(LoopContext& s, StepRunner& runner, const char* prefix) {
  if (runner.disable_shuffle())
    s.warn(
        fmt::format("You requested to overfit but enabled {0} dataloader shuffling. We are turning off the {0} "
                    "dataloader shuffling for you.",
                    prefix));
}

void InferenceLoop::use(StepRunner* runner) {
  runner_ = runner;
  set_up_ = opened_ = false;
  max_batches.reset();
}

// Lightning's _should_reload_val_dl, for fit's validation loop.
bool InferenceLoop::reload_due() const {
  const int64_t every = s.options.reload_dataloaders_every_n_epochs;
  // A loader given to fit is the same object again: only a made one reloads.
  return every > 0 && stage_ == Stage::validate && s.stage == "fit" && opened_ && !runner_->source_name().empty() &&
         s.fit().current_epoch() - reloaded_in_epoch_ >= every;
}

bool InferenceLoop::inference_mode() const {
  return s.options.inference_mode && s.stage != "fit" && !(s.ddp && s.ddp->group().backend() == "gloo");
}

bool InferenceLoop::setup_data() {
  if (set_up_ && !reload_due()) return opened_;
  set_up_ = true;
  if (s.stage == "fit") reloaded_in_epoch_ = s.fit().current_epoch();
  if (runner_ == nullptr || !runner_->open()) return false;
  opened_ = true;
  runner_->bind(*s.accelerator, s.device_setup->device, s.precision.precision());
  runner_->record_indices(stage_ == Stage::predict);
  s.distribute(*runner_, /*even=*/false);
  s.warn_if_empty(*runner_, stage_);
  const LoopLimits& l = s.limits;
  if (stage_ == Stage::validate && l.overfit) stop_shuffling(s, *runner_, "val");
  const Limit& limit = stage_ == Stage::validate ? l.limit_val_batches
                       : stage_ == Stage::test   ? l.limit_test_batches
                                                 : l.limit_predict_batches;
  max_batches = LoopContext::resolve_limit(limit, *runner_, limit_name(stage_));
  return true;
}

// The loop's hooks where it starts, its epoch starts, its epoch ends and it
// ends; by stage (validate, test, predict).
void InferenceLoop::hook(Point point) {
  static const LoopHook hooks[3][4] = {
      {{"on_validation_start", &Callback::on_validation_start, &ModuleBase::on_validation_start},
       {"on_validation_epoch_start", &Callback::on_validation_epoch_start, &ModuleBase::on_validation_epoch_start},
       {"on_validation_epoch_end", &Callback::on_validation_epoch_end, &ModuleBase::on_validation_epoch_end},
       {"on_validation_end", &Callback::on_validation_end, &ModuleBase::on_validation_end}},
      {{"on_test_start", &Callback::on_test_start, &ModuleBase::on_test_start},
       {"on_test_epoch_start", &Callback::on_test_epoch_start, &ModuleBase::on_test_epoch_start},
       {"on_test_epoch_end", &Callback::on_test_epoch_end, &ModuleBase::on_test_epoch_end},
       {"on_test_end", &Callback::on_test_end, &ModuleBase::on_test_end}},
      {{"on_predict_start", &Callback::on_predict_start, &ModuleBase::on_predict_start},
       {"on_predict_epoch_start", &Callback::on_predict_epoch_start, &ModuleBase::on_predict_epoch_start},
       {"on_predict_epoch_end", &Callback::on_predict_epoch_end, &ModuleBase::on_predict_epoch_end},
       {"on_predict_end", &Callback::on_predict_end, &ModuleBase::on_predict_end}}};
  const LoopHook& h = hooks[static_cast<int>(stage_) - 1][point];
  s.hooks.both(h.name, h.callback, h.module);
}

void InferenceLoop::batch_hook(bool start, int64_t i, const torch::Tensor& out) {
  ModuleBase& m = *s.module;
  const BatchEnd end = batch_end(*runner_, out, i);
  switch (stage_) {
    case Stage::validate:
      if (start) {
        s.hooks.callbacks().on_validation_batch_start(i);
        s.hooks.module("on_validation_batch_start", [&] { m.on_validation_batch_start(i); });
      } else {
        s.hooks.callbacks().on_validation_batch_end(end);
        s.hooks.module("on_validation_batch_end", [&] { m.on_validation_batch_end(i); });
      }
      break;
    case Stage::test:
      if (start) {
        s.hooks.callbacks().on_test_batch_start(i);
        s.hooks.module("on_test_batch_start", [&] { m.on_test_batch_start(i); });
      } else {
        s.hooks.callbacks().on_test_batch_end(end);
        s.hooks.module("on_test_batch_end", [&] { m.on_test_batch_end(i); });
      }
      break;
    case Stage::predict:
      if (start) {
        s.hooks.callbacks().on_predict_batch_start(i);
        s.hooks.module("on_predict_batch_start", [&] { m.on_predict_batch_start(i); });
      } else {
        s.hooks.callbacks().on_predict_batch_end(end);
        s.hooks.module("on_predict_batch_end", [&] { m.on_predict_batch_end(out, i); });
      }
      break;
    case Stage::train:
      break;
  }
}

void InferenceLoop::run_batches(std::optional<int64_t> limit, std::vector<torch::Tensor>* outputs) {
  // Lightning's names: its _EvaluationLoop runs validate and test, its
  // _PredictionLoop predict; the strategy calls the step.
  const char* next_action = stage_ == Stage::validate ? "[_EvaluationLoop].val_next"
                            : stage_ == Stage::test   ? "[_EvaluationLoop].test_next"
                                                      : "[_PredictionLoop].predict_next";
  const char* step_action = stage_ == Stage::validate ? "validation_step"
                            : stage_ == Stage::test   ? "test_step"
                                                      : "predict_step";
  batch_progress.reset_on_run();
  batches_this_run = limit;
  runner_->start_epoch();
  while (!limit || batch_progress.current.ready < *limit) {
    bool fetched;
    {
      ProfileScope timed(s.hooks.stage(next_action));
      fetched = runner_->next(true);
    }
    if (!fetched) {
      batch_progress.is_last_batch = true;
      break;
    }
    const int64_t i = batch_progress.current.ready;
    batch_progress.increment_ready();
    s.metrics.current_batch_size = runner_->batch_size();
    s.metrics.context = LogContext::eval_step;
    batch_hook(true, i, {});
    batch_progress.increment_started();
    torch::Tensor out = [&] {
      ProfileScope timed(s.hooks.strategy(step_action));
      return runner_->step(stage_, i);
    }();
    batch_progress.increment_processed();
    batch_hook(false, i, out);
    runner_->drop_batch();
    if (outputs) outputs->push_back(std::move(out));
    {
      ProfileScope timed(s.hooks.stage("[_LoggerConnector].update_eval_step_metrics"));
      s.metrics.flush_step_logs();
    }
    s.metrics.context = LogContext::none;
    batch_progress.increment_completed();
  }
}

}  // namespace fulgor::detail
