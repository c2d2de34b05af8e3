#include "loops/manual_optimization.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "fulgor/distributed/strategy.h"
#include "loops/module_access.h"
#include "loops/context.h"
#include "loops/fit_loop.h"

namespace fulgor::detail {

void ManualOptimization::attach(ModuleBase& module, bool attach) {
  std::vector<ManualOptimizer> optimizers;
  if (attach)
    for (const auto& optimizer : s.optim.optimizers) optimizers.emplace_back(*this, *optimizer);
  ModuleAccess::set_manual(module, attach ? this : nullptr, std::move(optimizers));
}

void ManualOptimization::check(const ModuleBase& module) const {
  const auto& o = s.options;
  if (module.automatic_optimization()) {
    // Note [Several optimizers]
    // Automatic optimization steps the optimizer with each training_step's
    // loss. Several optimizers are there for parts of a model with
    // objectives of their own (a GAN's generator and discriminator), which
    // one loss stepping them all would ignore: Lightning 2 allows them only
    // under manual optimization, and so does fulgor.
    if (s.optim.optimizers.size() > 1)
      throw ConfigError(fmt::format(
          "{}::configure_optimizers returned {} optimizers: training with several optimizers is only supported "
          "with manual optimization. Call set_automatic_optimization(false) in the module's constructor, then step "
          "them in training_step through optimizers()",
          module.name(), s.optim.optimizers.size()));
    return;
  }
  if (s.ddp && s.ddp->sharding() != Sharding::none)
    throw ConfigError(fmt::format(
        "{} optimizes manually, which a sharded strategy (strategy=fsdp, or zero_redundancy_optimizer) does not "
        "support: it gathers the parameters after the optimizer steps that the Trainer takes. Use strategy=ddp, or "
        "automatic optimization",
        module.name()));
  if (o.gradient_clip_val && *o.gradient_clip_val > 0)
    throw ConfigError(
        fmt::format("automatic gradient clipping is not supported for manual optimization: remove gradient_clip_val={} "
                    "(call clip_gradients in training_step instead) or turn automatic optimization on",
                    *o.gradient_clip_val));
  if (o.accumulate_grad_batches != 1)
    throw ConfigError(
        fmt::format("automatic gradient accumulation is not supported for manual optimization: remove "
                    "accumulate_grad_batches={} or turn automatic optimization on",
                    o.accumulate_grad_batches));
}

// Lightning's Strategy.backward with its precision plugin's pre_backward and
// post_backward around it.
void ManualOptimization::backward(const torch::Tensor& loss) {
  if (!loss.defined() || !loss.requires_grad())
    throw ConfigError(fmt::format("{}.manual_backward: the loss {}", s.module->name(),
                                  loss.defined() ? "does not require grad" : "is undefined"));
  s.hooks.callbacks().on_before_backward(loss);
  s.hooks.module("on_before_backward", [&] { s.module->on_before_backward(loss); });
  {
    ProfileScope timed(s.hooks.strategy("backward"));
    s.precision.backward(loss, *s.module);
    if (s.ddp != nullptr) s.ddp->after_backward();
  }
  s.hooks.callbacks().on_after_backward();
  s.hooks.module("on_after_backward", [&] { s.module->on_after_backward(); });
}

// Lightning's Precision._after_closure, without the clipping that manual
// optimization leaves to the module.
void ManualOptimization::before_optimizer_step(torch::optim::Optimizer& optimizer) {
  s.precision.unscale(optimizer);
  s.hooks.callbacks().on_before_optimizer_step(optimizer);
  s.hooks.module("on_before_optimizer_step", [&] { s.module->on_before_optimizer_step(optimizer); });
}

// LightningOptimizer.step under _ManualOptimization: the step is timed as
// "optimizer_step" and counted as a global step once done, skipped or not.
torch::Tensor ManualOptimization::step(torch::optim::Optimizer& optimizer,
                                       const torch::optim::Optimizer::LossClosure& closure) {
  if (s.module == nullptr || s.module->automatic_optimization())
    throw Error(
        "ManualOptimizer::step is for manual optimization; under automatic optimization the Trainer steps the "
        "optimizer (override optimizer_step to change how)");
  torch::Tensor result;
  {
    ProfileScope timed(s.hooks.stage("optimizer_step"));
    if (s.precision.scaler() != nullptr) {
      // MixedPrecision.optimizer_step: the closure, then unscale, the hooks
      // and the scaler's step, which the closure cannot go through.
      if (closure) result = closure();
      before_optimizer_step(optimizer);
      s.precision.step(optimizer);
      s.precision.update();
    } else if (closure) {
      result = optimizer.step([&] {
        torch::Tensor loss = closure();
        before_optimizer_step(optimizer);
        return loss;
      });
    } else {
      before_optimizer_step(optimizer);
      optimizer.step();
    }
  }
  ++s.fit().epoch_loop.global_step;
  return result;
}

}  // namespace fulgor::detail
