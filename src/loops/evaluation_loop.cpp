#include "loops/evaluation_loop.h"

#include <torch/torch.h>

#include <algorithm>

#include "checkpoint/rng.h"
#include "loops/context.h"
#include "loops/module_access.h"

namespace fulgor::detail {

bool EvaluationLoop::enabled() const {
  return has_loader() && s.limits.limit_val_batches.of(std::nullopt) != 0 && max_batches != 0;
}

std::map<std::string, double> EvaluationLoop::run() {
  if (!setup_data()) return {};
  return run_limited(max_batches);
}

// Lightning's _on_evaluation_model_eval and _on_evaluation_model_train.
void EvaluationLoop::model_mode_hook(bool eval) {
  ModuleBase& m = *s.module;
  if (eval) ModuleAccess::record_mode(m);
  if (stage() == Stage::validate) {
    if (eval)
      s.hooks.module("on_validation_model_eval", [&] { m.on_validation_model_eval(); });
    else
      s.hooks.module("on_validation_model_train", [&] { m.on_validation_model_train(); });
  } else {
    if (eval)
      s.hooks.module("on_test_model_eval", [&] { m.on_test_model_eval(); });
    else
      s.hooks.module("on_test_model_train", [&] { m.on_test_model_train(); });
  }
}

// Lightning's _EvaluationLoop.run: a loop with no batches to run (its
// `skip`) calls no hook.
std::map<std::string, double> EvaluationLoop::run_limited(std::optional<int64_t> limit) {
  if (limit == 0) return {};
  const RunningStage previous = s.running;
  if (!s.sanity_checking()) s.running = stage() == Stage::validate ? RunningStage::validating : RunningStage::testing;
  s.metrics.eval_accumulators.clear();
  std::map<std::string, double> result;
  {
    NoGradContext no_grad(inference_mode());
    model_mode_hook(true);
    hook(kStart);
    hook(kEpochStart);
    run_batches(limit, nullptr);
    s.metrics.refresh(s.metrics.eval_accumulators);
    s.metrics.context = LogContext::eval_epoch;
    hook(kEpochEnd);
    s.metrics.context = LogContext::none;
    {
      ProfileScope timed(s.hooks.stage("[_LoggerConnector].update_eval_epoch_metrics"));
      result = s.metrics.aggregate(s.metrics.eval_accumulators);
    }
    hook(kEnd);
    model_mode_hook(false);
  }
  s.running = previous;
  return result;
}

void EvaluationLoop::sanity_check() {
  const int64_t steps = s.limits.num_sanity_val_steps;
  if (steps == 0 || !enabled()) return;
  const torch::Tensor cpu_state = cpu_rng_state(), device_state = s.accelerator->get_rng_state(s.device_setup->device);
  s.metrics.clear();
  const RunningStage previous = s.running;
  s.running = RunningStage::sanity_checking;
  s.hooks.callbacks().on_sanity_check_start();
  // Lightning's val_loop.run asks for the loader now, after the hook.
  if (setup_data()) {
    std::optional<int64_t> limit = max_batches;
    if (steps > 0) limit = limit ? std::min(*limit, steps) : steps;
    run_limited(limit);
  }
  s.hooks.callbacks().on_sanity_check_end();
  s.running = previous;
  s.metrics.clear();
  set_cpu_rng_state(cpu_state);
  s.accelerator->set_rng_state(s.device_setup->device, device_state);
}

}  // namespace fulgor::detail
