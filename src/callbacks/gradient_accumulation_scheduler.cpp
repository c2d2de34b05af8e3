#include "fulgor/callbacks/gradient_accumulation_scheduler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/module.h"
#include "fulgor/trainer.h"

namespace fulgor {

GradientAccumulationScheduler::GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling)
    : scheduling_(std::move(scheduling)) {
  if (scheduling_.empty())
    throw ConfigError("GradientAccumulationScheduler: the schedule is empty; expected {epoch: factor} pairs");
  std::vector<int64_t> epochs, factors;
  for (const auto& [epoch, factor] : scheduling_) {
    epochs.push_back(epoch);
    factors.push_back(factor);
  }
  if (epochs.front() < 0)
    throw ConfigError(fmt::format("GradientAccumulationScheduler: epochs {}: expected integers >= 0", epochs));
  if (*std::min_element(factors.begin(), factors.end()) < 1)
    throw ConfigError(fmt::format("GradientAccumulationScheduler: factors {}: expected integers >= 1", factors));
  scheduling_.emplace(0, 1);  // no effect where epoch 0 has a factor
}

int64_t GradientAccumulationScheduler::get_accumulate_grad_batches(int64_t epoch) const {
  auto after = scheduling_.upper_bound(epoch);
  return after == scheduling_.begin() ? 1 : std::prev(after)->second;
}

bool GradientAccumulationScheduler::going_to_accumulate_grad_batches() const {
  return std::any_of(scheduling_.begin(), scheduling_.end(), [](const auto& entry) { return entry.second > 1; });
}

void GradientAccumulationScheduler::on_train_start(Trainer& trainer, ModuleBase& module) {
  if (!module.automatic_optimization())
    throw ConfigError(
        fmt::format("GradientAccumulationScheduler: {} optimizes manually, which accumulates in its "
                    "own training_step; remove the callback or turn automatic optimization on",
                    module.name()));
  if (trainer.options().accumulate_grad_batches != 1)
    throw ConfigError(
        fmt::format("GradientAccumulationScheduler with accumulate_grad_batches={}: expected one of "
                    "the two; remove the option or the callback",
                    trainer.options().accumulate_grad_batches));
}

void GradientAccumulationScheduler::on_train_epoch_start(Trainer& trainer, ModuleBase&) {
  trainer.set_accumulate_grad_batches(get_accumulate_grad_batches(trainer.current_epoch()));
}

}  // namespace fulgor
