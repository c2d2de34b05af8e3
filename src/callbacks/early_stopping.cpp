// EarlyStopping: Lightning 2.6's callbacks/early_stopping.py.

#include "fulgor/callbacks/early_stopping.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <iostream>
#include <limits>

#include "callbacks/python_format.h"
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
  auto finite = [](const char* name, std::optional<double> value) {
    if (value && !std::isfinite(*value))
      throw ConfigError(fmt::format("EarlyStopping: {} must be a finite number, got {}", name, *value));
  };
  finite("min_delta", options_.min_delta);
  finite("stopping_threshold", options_.stopping_threshold);
  finite("divergence_threshold", options_.divergence_threshold);
  // As Lightning: the sign is the mode's, the value's own sign is kept (a
  // negative min_delta lets a slightly worse value count as an improvement).
  min_delta_ = options_.mode == "max" ? options_.min_delta : -options_.min_delta;
  best_score_ =
      options_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

std::string EarlyStopping::state_key() const {
  return fmt::format("EarlyStopping{{monitor={},mode={}}}", options_.monitor, options_.mode);
}

nlohmann::json EarlyStopping::state_dict() const {
  return {{"wait_count", wait_count_},
          {"stopped_epoch", stopped_epoch_},
          {"best_score", finite_or_null(best_score_)},
          {"patience", options_.patience},
          {"stopping_reason", static_cast<int>(stopping_reason_)},
          {"stopping_reason_message",
           stopping_reason_message_.empty() ? nlohmann::json(nullptr) : nlohmann::json(stopping_reason_message_)}};
}

void EarlyStopping::load_state_dict(const nlohmann::json& state) {
  wait_count_ = state.at("wait_count").get<int64_t>();
  stopped_epoch_ = state.at("stopped_epoch").get<int64_t>();
  if (!state.at("best_score").is_null()) best_score_ = state.at("best_score").get<double>();
  options_.patience = state.at("patience").get<int64_t>();
  const int reason = state.value("stopping_reason", 0);
  if (reason < 0 || reason > static_cast<int>(EarlyStoppingReason::non_finite_metric))
    throw CheckpointError(fmt::format("EarlyStopping state: stopping_reason {} is not one of 0..4", reason));
  stopping_reason_ = static_cast<EarlyStoppingReason>(reason);
  const auto message = state.find("stopping_reason_message");
  stopping_reason_message_ = message != state.end() && message->is_string() ? message->get<std::string>() : "";
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

// Lightning's _run_early_stopping_check.
void EarlyStopping::check(Trainer& trainer) {
  const auto& metrics = trainer.callback_metrics();
  if (trainer.options().fast_dev_run > 0 || !validate_condition_metric(metrics)) return;
  auto [should_stop, reason] = evaluate_stopping_criteria(metrics.at(options_.monitor));
  // Every rank stops when any rank's metric says so.
  should_stop = trainer.reduce_boolean_decision(should_stop, /*all=*/false);
  if (should_stop) {
    stopped_epoch_ = trainer.current_epoch();
    stopping_reason_message_ = reason;
    trainer.request_stop(reason);
  }
  if (!reason.empty() && options_.verbose) log_info(trainer, reason);
}

// Lightning's _evaluate_stopping_criteria, with its messages.
std::pair<bool, std::string> EarlyStopping::evaluate_stopping_criteria(double current) {
  const bool min_mode = options_.mode == "min";
  auto monitor_op = [&](double a, double b) { return min_mode ? a < b : a > b; };
  const std::string& monitor = options_.monitor;
  if (options_.check_finite && !std::isfinite(current)) {
    stopping_reason_ = EarlyStoppingReason::non_finite_metric;
    return {true, fmt::format("Monitored metric {} = {} is not finite. Previous best value was {:.3f}. Signaling "
                              "Trainer to stop.",
                              monitor, detail::python_repr(current), best_score_)};
  }
  if (options_.stopping_threshold && monitor_op(current, *options_.stopping_threshold)) {
    stopping_reason_ = EarlyStoppingReason::stopping_threshold;
    return {true, fmt::format("Stopping threshold reached: {} = {} {} {}. Signaling Trainer to stop.", monitor,
                              detail::python_repr(current), min_mode ? "<" : ">",
                              detail::python_repr(*options_.stopping_threshold))};
  }
  if (options_.divergence_threshold && monitor_op(-current, -*options_.divergence_threshold)) {
    stopping_reason_ = EarlyStoppingReason::divergence_threshold;
    // Lightning's words, the mode's sign included ("<" for "min"), although
    // the value is past the threshold the other way.
    return {true, fmt::format("Divergence threshold reached: {} = {} {} {}. Signaling Trainer to stop.", monitor,
                              detail::python_repr(current), min_mode ? "<" : ">",
                              detail::python_repr(*options_.divergence_threshold))};
  }
  if (monitor_op(current - min_delta_, best_score_)) {
    std::string message =
        std::isfinite(best_score_)
            ? fmt::format("Metric {} improved by {:.3f} >= min_delta = {}. New best score: {:.3f}", monitor,
                          std::abs(best_score_ - current), detail::python_repr(std::abs(min_delta_)), current)
            : fmt::format("Metric {} improved. New best score: {:.3f}", monitor, current);
    best_score_ = current;
    wait_count_ = 0;
    return {false, message};
  }
  if (++wait_count_ >= options_.patience) {
    stopping_reason_ = EarlyStoppingReason::patience_exhausted;
    return {true, fmt::format("Monitored metric {} did not improve in the last {} records. Best score: {:.3f}. "
                              "Signaling Trainer to stop.",
                              monitor, wait_count_, best_score_)};
  }
  return {false, ""};
}

// Lightning's _log_info: in a ddp job each rank's line names the rank, and
// with log_rank_zero_only only rank 0 prints.
void EarlyStopping::log_info(const Trainer& trainer, const std::string& message) const {
  if (trainer.world_size() > 1) {
    if (options_.log_rank_zero_only && trainer.global_rank() != 0) return;
    std::cout << fmt::format("[rank: {}] {}", trainer.global_rank(), message) << std::endl;
  } else {
    std::cout << message << std::endl;
  }
}

}  // namespace fulgor
