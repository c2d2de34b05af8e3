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

std::string metric_names(const std::map<std::string, double>& metrics) {
  std::vector<std::string> names;
  for (const auto& [k, v] : metrics) names.push_back(k);
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

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
  // Lightning checks after validation when fit validates, else at epoch end.
  (void)trainer;
  on_validation_ = false;
}

void EarlyStopping::on_validation_end(Trainer& trainer, ModuleBase&) {
  if (trainer.stage() != "fit" || trainer.sanity_checking()) return;
  on_validation_ = true;
  check(trainer);
}

void EarlyStopping::on_train_epoch_end(Trainer& trainer, ModuleBase&) {
  if (!on_validation_) check(trainer);
}

void EarlyStopping::check(Trainer& trainer) {
  const auto& metrics = trainer.callback_metrics();
  auto it = metrics.find(options_.monitor);
  if (it == metrics.end()) {
    if (!options_.strict) return;
    throw ConfigError(fmt::format("EarlyStopping could not find the monitored metric '{}'; logged metrics: {}",
                                  options_.monitor, metric_names(metrics)));
  }
  const double current = it->second;
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
