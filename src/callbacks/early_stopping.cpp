// EarlyStopping: Lightning 2.6's callbacks/early_stopping.py.

#include "fulgor/callbacks/early_stopping.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <iostream>
#include <limits>

#include "fulgor/trainer.h"

namespace fulgor {
namespace {

// JSON has no infinity; the "nothing yet" score is stored as null.
nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  if (options_.mode != "min" && options_.mode != "max")
    throw ConfigError(fmt::format("EarlyStopping: mode must be \"min\" or \"max\", got \"{}\"", options_.mode));
  if (options_.monitor.empty()) throw ConfigError("EarlyStopping needs a metric to monitor");
  // A positive min_delta must be beaten in the mode's direction.
  options_.min_delta = std::abs(options_.min_delta) * (options_.mode == "min" ? -1.0 : 1.0);
  best_ = options_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

std::string EarlyStopping::state_key() const {
  return fmt::format("EarlyStopping{{monitor={},mode={}}}", options_.monitor, options_.mode);
}

nlohmann::json EarlyStopping::state_dict() const {
  return {{"wait_count", wait_},
          {"stopped_epoch", stopped_epoch_},
          {"best_score", finite_or_null(best_)},
          {"patience", options_.patience}};
}

void EarlyStopping::load_state_dict(const nlohmann::json& state) {
  wait_ = state.at("wait_count").get<int64_t>();
  stopped_epoch_ = state.at("stopped_epoch").get<int64_t>();
  if (!state.at("best_score").is_null()) best_ = state.at("best_score").get<double>();
}

void EarlyStopping::setup(Trainer& trainer, ModuleBase&, const std::string&) {
  // Note [When EarlyStopping checks]
  // As in Lightning's setup: at the end of each training epoch when every
  // epoch ends with exactly one validation run (or has none), else after
  // each validation run, so that an epoch without validation (with
  // check_val_every_n_epoch > 1) is not checked.
  if (!options_.check_on_train_epoch_end) {
    const TrainerOptions& o = trainer.options();
    const Limit& interval = o.val_check_interval;
    const bool one_per_epoch = interval.is_count() ? interval.count() == 1 : interval.fraction() == 1.0;
    options_.check_on_train_epoch_end = one_per_epoch && o.check_val_every_n_epoch == 1;
  }
}

bool EarlyStopping::should_skip_check(const Trainer& trainer) const {
  return trainer.stage() != "fit" || trainer.sanity_checking();
}

void EarlyStopping::on_validation_end(Trainer& trainer, ModuleBase&) {
  if (options_.check_on_train_epoch_end.value_or(false) || should_skip_check(trainer)) return;
  check(trainer);
}

void EarlyStopping::on_train_epoch_end(Trainer& trainer, ModuleBase&) {
  if (!options_.check_on_train_epoch_end.value_or(false) || should_skip_check(trainer)) return;
  check(trainer);
}

// Lightning's _validate_condition_metric.
bool EarlyStopping::validate_condition_metric(const std::map<std::string, double>& logs) const {
  if (logs.count(options_.monitor)) return true;
  std::vector<std::string> names;
  for (const auto& [name, value] : logs) names.push_back(name);
  const std::string message = fmt::format(
      "Early stopping conditioned on metric `{}` which is not available. Pass in or modify your `EarlyStopping` "
      "callback to use any of the following: `{}`",
      options_.monitor, fmt::join(names, "`, `"));
  if (options_.strict) throw ConfigError(message);
  if (options_.verbose) std::cerr << message << std::endl;
  return false;
}

void EarlyStopping::check(Trainer& trainer) {
  const auto& metrics = trainer.callback_metrics();
  if (trainer.options().fast_dev_run > 0 || !validate_condition_metric(metrics)) return;
  const double current = metrics.at(options_.monitor);
  const bool min_mode = options_.mode == "min";
  auto improves = [&](double a, double b) { return min_mode ? a < b : a > b; };
  std::string reason;
  if (options_.check_finite && !std::isfinite(current)) {
    reason = fmt::format("Monitored metric {} = {} is not finite. Previous best value was {:.3f}.", options_.monitor,
                         current, best_);
  } else if (options_.stopping_threshold && improves(current, *options_.stopping_threshold)) {
    reason = fmt::format("Stopping threshold reached: {} = {} {} {}.", options_.monitor, current, min_mode ? "<" : ">",
                         *options_.stopping_threshold);
  } else if (options_.divergence_threshold && improves(*options_.divergence_threshold, current)) {
    reason = fmt::format("Divergence threshold reached: {} = {} {} {}.", options_.monitor, current,
                         min_mode ? ">" : "<", *options_.divergence_threshold);
  } else if (improves(current - options_.min_delta, best_)) {
    best_ = current;
    wait_ = 0;
  } else if (++wait_ >= options_.patience) {
    reason = fmt::format("Monitored metric {} did not improve in the last {} records. Best score: {:.3f}.",
                         options_.monitor, wait_, best_);
  }
  if (reason.empty()) return;
  reason_ = "EarlyStopping: " + reason;
  stopped_epoch_ = trainer.current_epoch();
  if (options_.verbose) std::cout << reason_ << " Signaling Trainer to stop." << std::endl;
  trainer.request_stop(reason_);
}

}  // namespace fulgor
