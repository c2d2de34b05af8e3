#pragma once

// Lightning's _AutomaticOptimization (and the one-call _ManualOptimization):
// training_step, accumulation, backward, the optimizer step and the
// schedulers, with their hooks in Lightning's order. Included by
// training_epoch_loop.cpp alone, so that the per-step path stays in one
// translation unit (Note [The per-step path] there).

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "fulgor/distributed/strategy.h"
#include "loops/context.h"
#include "loops/fit_loop.h"

namespace fulgor::detail {

// Lightning's precision and strategy backward: the loss scaled under
// "16-mixed", the module's backward hook, and under ddp the wait for the
// gradients' averaging.
inline void run_backward(LoopContext& s, const torch::Tensor& loss) {
  ProfileScope timed(s.hooks.strategy("backward"));
  s.precision.backward(loss, *s.module);
  if (FULGOR_UNLIKELY(s.ddp != nullptr)) s.ddp->after_backward();
}

// Note [The optimizer closure]
// Lightning steps the optimizer with optimizer.step(closure), where the
// closure runs training_step, zero_grad (on an accumulation window's first
// batch) and backward; the step then calls on_before_optimizer_step, clips
// and steps. A batch that does not step runs the closure alone. fulgor
// keeps that order, the module's optimizer_step deciding when the closure
// runs. `window` counts the batches whose gradients wait for a step: a
// training_step returning an undefined loss adds none, and a window without
// any is not stepped.
struct AutomaticOptimization {
  explicit AutomaticOptimization(LoopContext& state) : s(state) {}

  double monitored(const SchedulerConfig& config, bool& found) const {
    s.metrics.read_deferred();
    auto it = s.metrics.callback_metrics.map().find(config.monitor);
    found = it != s.metrics.callback_metrics.map().end();
    if (!found && config.strict) {
      // Lightning's message, the names as Python writes a list of strings.
      std::vector<std::string> names;
      for (const auto& [k, v] : s.metrics.callback_metrics.map()) names.push_back("'" + k + "'");
      throw ConfigError(fmt::format("ReduceLROnPlateau conditioned on metric {} which is not available. Available "
                                    "metrics are: [{}]. Condition can be set using `monitor` key in lr scheduler dict",
                                    config.monitor, fmt::join(names, ", ")));
    }
    if (!found)
      s.warn_once(fmt::format("ReduceLROnPlateau conditioned on metric {} which is not available but strict is set "
                              "to `False`. Skipping learning rate update.",
                              config.monitor));
    return found ? it->second : 0.0;
  }

  // Note [Scheduler frequency]
  // As Lightning's _update_learning_rates, a scheduler steps when `count`,
  // its interval's number from 1, is a multiple of its frequency: for an
  // epoch scheduler the epoch's, for a step scheduler the batch's within the
  // epoch (batch_idx + 1), not the optimizer step's. A batch that accumulates
  // never gets here, so with accumulate_grad_batches = 2 and frequency 3 a
  // step scheduler steps at the 6th batch of an epoch only, and an epoch whose
  // length is not a multiple of the frequency starts the count afresh. A
  // resume mid-epoch continues the batch index, hence the schedule.
  void step_schedulers(Interval interval, int64_t count) {
    for (auto& config : s.optim.schedulers) {
      if (config.interval != interval || count % config.frequency != 0) continue;
      if (config.monitor.empty()) {
        s.hooks.module("lr_scheduler_step", [&] { s.module->lr_scheduler_step(*config.scheduler, std::nullopt); });
        continue;
      }
      bool found = false;
      double value = monitored(config, found);
      if (found) s.hooks.module("lr_scheduler_step", [&] { s.module->lr_scheduler_step(*config.scheduler, value); });
    }
  }

  [[noreturn]] void throw_bad_loss(const torch::Tensor& loss) const {
    throw ConfigError(fmt::format("{}::training_step must return a scalar loss that requires grad; got shape [{}]{}",
                                  s.module->name(), fmt::join(loss.sizes(), ", "),
                                  loss.requires_grad() ? "" : " without grad"));
  }

  torch::Tensor run_closure(StepRunner& train, int64_t batch_idx, bool steps_optimizer) {
    std::optional<torch::autograd::DetectAnomalyGuard> anomaly;
    if (FULGOR_UNLIKELY(s.options.detect_anomaly)) anomaly.emplace();
    // Gradients travel only on the batches that step the optimizer.
    if (FULGOR_UNLIKELY(s.ddp != nullptr)) s.ddp->before_forward(steps_optimizer);
    torch::Tensor loss = [&] {
      ProfileScope timed(s.hooks.strategy("training_step"));
      return train.step(Stage::train, batch_idx);
    }();
    if (loss.defined() && FULGOR_UNLIKELY(loss.numel() != 1 || !loss.requires_grad())) throw_bad_loss(loss);
    if (batch_idx % s.accumulate_grad_batches == 0) {
      auto& optimizer = *s.optim.optimizers.front();
      s.hooks.callbacks().on_before_zero_grad(optimizer);
      s.hooks.module("on_before_zero_grad", [&] { s.module->on_before_zero_grad(optimizer); });
      s.hooks.module("optimizer_zero_grad", [&] { s.module->optimizer_zero_grad(s.fit().current_epoch(), batch_idx, optimizer); });
    }
    if (!loss.defined()) return loss;
    const int64_t accumulate = s.accumulate_grad_batches;
    // The loss itself, not a copy, unless accumulating.
    const torch::Tensor divided =
        FULGOR_UNLIKELY(accumulate > 1) ? loss / static_cast<double>(accumulate) : torch::Tensor();
    const torch::Tensor& scaled = divided.defined() ? divided : loss;
    s.hooks.callbacks().on_before_backward(scaled);
    s.hooks.module("on_before_backward", [&] { s.module->on_before_backward(scaled); });
    run_backward(s, scaled);
    s.hooks.callbacks().on_after_backward();
    s.hooks.module("on_after_backward", [&] { s.module->on_after_backward(); });
    ++window;
    return loss;
  }

  // What optimizer.step does after the closure. False: nothing to step.
  bool step_optimizer() {
    if (window == 0) return false;
    auto& optimizer = *s.optim.optimizers.front();
    s.precision.unscale(optimizer);  // clipping and the hooks see true gradients
    s.hooks.callbacks().on_before_optimizer_step(optimizer);
    s.hooks.module("on_before_optimizer_step", [&] { s.module->on_before_optimizer_step(optimizer); });
    s.hooks.module("configure_gradient_clipping", [&] {
      s.module->configure_gradient_clipping(optimizer, s.options.gradient_clip_val, s.options.gradient_clip_algorithm);
    });
    {
      ProfileScope timed(s.hooks.strategy("optimizer_step"));
      s.precision.step(optimizer);
      s.precision.update();
      if (FULGOR_UNLIKELY(s.ddp != nullptr)) s.ddp->after_optimizer_step();
    }
    window = 0;
    return true;
  }

  struct StepClosure final : OptimizerClosure {
    StepClosure(AutomaticOptimization& owner, StepRunner* runner, int64_t idx) : batch(owner), train(runner), batch_idx(idx) {}
    void operator()() override {
      if (called) throw Error("optimizer_step called its optimizer_closure twice");
      called = true;
      if (train) loss = batch.run_closure(*train, batch_idx, true);
      stepped = batch.step_optimizer();
    }
    AutomaticOptimization& batch;
    StepRunner* train;  // nullptr: the window's batches have run already
    int64_t batch_idx;
    torch::Tensor loss;
    bool called = false, stepped = false;
  };

  // Runs the module's optimizer_step. Note [Skipped steps]: a step the
  // GradScaler skips still counts, and per-step schedulers still step, as in
  // Lightning: global_step counts optimizer steps attempted (as does one
  // whose optimizer_step never called the closure).
  torch::Tensor optimizer_step(StepRunner* train, int64_t batch_idx) {
    StepClosure closure(*this, train, batch_idx);
    s.hooks.module("optimizer_step",
                  [&] { s.module->optimizer_step(s.fit().current_epoch(), batch_idx, *s.optim.optimizers.front(), closure); });
    if (closure.stepped || !closure.called) {
      ++s.fit().epoch_loop.global_step;
      step_schedulers(Interval::step, batch_idx + 1);  // Note [Scheduler frequency]
    }
    return std::move(closure.loss);
  }

  // Lightning's _ManualOptimization.advance: training_step alone, which
  // does its own backward passes and steps (ManualOptimization); every batch
  // counts as one that stepped. Gradients travel with each backward pass.
  torch::Tensor manual_step(StepRunner& train, int64_t batch_idx) {
    std::optional<torch::autograd::DetectAnomalyGuard> anomaly;
    if (s.options.detect_anomaly) anomaly.emplace();
    if (s.ddp != nullptr) s.ddp->before_forward(true);
    torch::Tensor loss = [&] {
      ProfileScope timed(s.hooks.strategy("training_step"));
      return train.step(Stage::train, batch_idx);
    }();
    ++s.fit().epoch_loop.batches_that_stepped;
    return loss;
  }

  LoopContext& s;
  int64_t window = 0;
};

}  // namespace fulgor::detail
