#include "evaluation_loop.h"

#include <torch/torch.h>

#include <algorithm>

#include "state.h"

namespace fulgor::detail {

namespace {
struct LoopHook {
  const char* name;
  void (Callback::*callback)(Trainer&, ModuleBase&);
  void (ModuleBase::*module)();
};
}  // namespace

// An evaluation loop's hooks where it starts, its epoch starts, its epoch
// ends and it ends; by stage (validate, test, predict).
void EvaluationLoop::hook(Stage st, Point point) {
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
  const LoopHook& h = hooks[static_cast<int>(st) - 1][point];
  s.each_callback(h.name, [&](Callback& cb) { (cb.*h.callback)(s.trainer, *s.module); });
  s.call_module(h.name, [&] { ((*s.module).*h.module)(); });
}

void EvaluationLoop::batch_hook(Stage st, bool start, int64_t i, const torch::Tensor& out) {
  ModuleBase& m = *s.module;
  switch (st) {
    case Stage::validate:
      if (start) {
        s.each_callback("on_validation_batch_start",
                        [&](Callback& cb) { cb.on_validation_batch_start(s.trainer, m, i); });
        s.call_module("on_validation_batch_start", [&] { m.on_validation_batch_start(i); });
      } else {
        s.each_callback("on_validation_batch_end", [&](Callback& cb) { cb.on_validation_batch_end(s.trainer, m, i); });
        s.call_module("on_validation_batch_end", [&] { m.on_validation_batch_end(i); });
      }
      break;
    case Stage::test:
      if (start) {
        s.each_callback("on_test_batch_start", [&](Callback& cb) { cb.on_test_batch_start(s.trainer, m, i); });
        s.call_module("on_test_batch_start", [&] { m.on_test_batch_start(i); });
      } else {
        s.each_callback("on_test_batch_end", [&](Callback& cb) { cb.on_test_batch_end(s.trainer, m, i); });
        s.call_module("on_test_batch_end", [&] { m.on_test_batch_end(i); });
      }
      break;
    case Stage::predict:
      if (start) {
        s.each_callback("on_predict_batch_start", [&](Callback& cb) { cb.on_predict_batch_start(s.trainer, m, i); });
        s.call_module("on_predict_batch_start", [&] { m.on_predict_batch_start(i); });
      } else {
        s.each_callback("on_predict_batch_end", [&](Callback& cb) { cb.on_predict_batch_end(s.trainer, m, i); });
        s.call_module("on_predict_batch_end", [&] { m.on_predict_batch_end(out, i); });
      }
      break;
    case Stage::train:
      break;
  }
}

void EvaluationLoop::run_batches(StepRunner& runner, Stage st, std::optional<int64_t> limit,
                                 std::vector<torch::Tensor>* outputs) {
  // Lightning's names: its _EvaluationLoop runs validate and test, its
  // _PredictionLoop predict; the strategy calls the step.
  const char* next_action = st == Stage::validate ? "[_EvaluationLoop].val_next"
                            : st == Stage::test   ? "[_EvaluationLoop].test_next"
                                                  : "[_PredictionLoop].predict_next";
  const char* step_action = st == Stage::validate ? "validation_step"
                            : st == Stage::test   ? "test_step"
                                                  : "predict_step";
  runner.start_epoch();
  for (int64_t i = 0; !limit || i < *limit; ++i) {
    bool fetched;
    {
      ProfileScope timed(s.profile(next_action));
      fetched = runner.next(true);
    }
    if (!fetched) break;
    s.metrics.current_batch_size = runner.batch_size();
    s.metrics.context = LogContext::eval_step;
    batch_hook(st, true, i, {});
    torch::Tensor out = [&] {
      ProfileScope timed(s.profile_strategy(step_action));
      return runner.step(st, i);
    }();
    batch_hook(st, false, i, out);
    if (outputs) outputs->push_back(std::move(out));
    {
      ProfileScope timed(s.profile("[_LoggerConnector].update_eval_step_metrics"));
      s.metrics.flush_step_logs();
    }
    s.metrics.context = LogContext::none;
  }
}

// One run of an evaluation loop (Lightning's _EvaluationLoop.run and
// _PredictionLoop.run): inside fit, in the sanity check, or on its own.
// Returns the epoch's values.
std::map<std::string, double> EvaluationLoop::run(StepRunner& runner, Stage st, std::optional<int64_t> limit,
                                                  std::vector<torch::Tensor>* outputs) {
  const bool was_training = s.module->is_training();
  const std::string previous_loop = s.loop;
  s.loop = s.sanity ? "sanity_check" : st == Stage::validate ? "validate" : st == Stage::test ? "test" : "predict";
  batches = limit;
  s.metrics.eval_accumulators.clear();
  s.module->eval();
  std::map<std::string, double> result;
  {
    torch::NoGradGuard no_grad;
    hook(st, kStart);
    hook(st, kEpochStart);
    run_batches(runner, st, limit, outputs);
    s.metrics.refresh(s.metrics.eval_accumulators);
    s.metrics.context = LogContext::eval_epoch;
    hook(st, kEpochEnd);
    s.metrics.context = LogContext::none;
    {
      ProfileScope timed(s.profile("[_LoggerConnector].update_eval_epoch_metrics"));
      result = s.metrics.aggregate(s.metrics.eval_accumulators);
    }
    hook(st, kEnd);
  }
  s.module->train(was_training);
  s.loop = previous_loop;
  return result;
}

// Lightning's _run_sanity_check: a short validation whose values reach no
// logger and are forgotten afterwards, leaving the generators as it found
// them so that it changes nothing in training.
void EvaluationLoop::sanity_check(StepRunner& runner, std::optional<int64_t> limit) {
  const int64_t steps = s.options.fast_dev_run > 0 ? 0 : s.options.num_sanity_val_steps;
  if (steps == 0) return;
  torch::Tensor cpu_state = cpu_rng_state(), device_state = s.accelerator->get_rng_state(*s.device);
  s.metrics.clear();
  s.sanity = true;
  s.each_callback("on_sanity_check_start", [&](Callback& cb) { cb.on_sanity_check_start(s.trainer, *s.module); });
  if (steps > 0) limit = limit ? std::min(*limit, steps) : steps;
  run(runner, Stage::validate, limit);
  s.each_callback("on_sanity_check_end", [&](Callback& cb) { cb.on_sanity_check_end(s.trainer, *s.module); });
  s.sanity = false;
  s.metrics.clear();
  set_cpu_rng_state(cpu_state);
  s.accelerator->set_rng_state(*s.device, device_state);
}

}  // namespace fulgor::detail

namespace fulgor {

using detail::Stage;

// Lightning's _run for validate, test and predict.
std::map<std::string, double> Trainer::run_eval(Stage stage, ModuleBase& model, detail::StepRunner& runner,
                                                const EvalOptions& eval_options, std::vector<torch::Tensor>* outputs,
                                                DataModuleBase* datamodule) {
  auto& s = *state_;
  const std::string name = stage == Stage::validate ? "validate" : stage == Stage::test ? "test" : "predict";
  s.begin(name);
  s.datamodule = datamodule;
  std::optional<detail::LoadedCheckpoint> ckpt;
  if (!eval_options.ckpt_path.empty()) ckpt = s.checkpoints.read(eval_options.ckpt_path);
  struct Scope {
    detail::TrainerState& s;
    ~Scope() { s.end(); }
  } scope{s};
  std::map<std::string, double> result;
  try {
    s.attach(model);
    s.attach_model_callbacks(model);
    s.setup_hooks(model, name);
    if (ckpt) s.checkpoints.restore_module_and_callbacks(*ckpt);
    if (datamodule) s.open_loader(runner, stage);
    runner.bind(*s.accelerator, *s.device, s.precision.precision());
    const auto limit = s.eval_limit(stage, runner);
    model.zero_grad();
    result = s.evaluation.run(runner, stage, limit, outputs);
    s.teardown_hooks(model, name);
    for (auto& logger : s.loggers) logger->finalize("success");
    s.describe_profile(name);
  } catch (const std::exception& e) {
    s.on_exception(model, e);
    throw;
  }
  return result;
}

}  // namespace fulgor
