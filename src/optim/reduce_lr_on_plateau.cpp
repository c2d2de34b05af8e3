#include "fulgor/optim/reduce_lr_on_plateau.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "fulgor/core/error.h"
#include "optim/schedule_support.h"

namespace fulgor {

using detail::counter_in;

ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, PlateauOptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  if (options_.mode != "min" && options_.mode != "max")
    throw ConfigError(fmt::format("ReduceLROnPlateau: mode must be \"min\" or \"max\", got \"{}\"", options_.mode));
  if (options_.threshold_mode != "rel" && options_.threshold_mode != "abs")
    throw ConfigError(fmt::format("ReduceLROnPlateau: threshold_mode must be \"rel\" or \"abs\", got \"{}\"",
                                  options_.threshold_mode));
  if (options_.factor >= 1.0)
    throw ConfigError(fmt::format("ReduceLROnPlateau: factor must be below 1, got {}", options_.factor));
  best_ = options_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  last_epoch_ = 0;
}

void ReduceLROnPlateau::step(std::optional<double> metric) {
  if (!metric) throw ConfigError("ReduceLROnPlateau needs a monitored metric: set SchedulerConfig::monitor");
  ++last_epoch_;
  const double v = *metric;
  if (is_better(v)) {
    best_ = v;
    num_bad_ = 0;
  } else {
    ++num_bad_;
  }
  if (cooldown_left_ > 0) {
    --cooldown_left_;
    num_bad_ = 0;
  }
  if (num_bad_ > options_.patience) {
    std::vector<double> lrs = current_lrs();
    // torch leaves a rate whose drop would not exceed eps.
    for (double& lr : lrs)
      if (const double reduced = std::max(lr * options_.factor, options_.min_lr); lr - reduced > options_.eps)
        lr = reduced;
    apply(lrs);
    cooldown_left_ = options_.cooldown;
    num_bad_ = 0;
  }
  last_lr_ = current_lrs();
}

bool ReduceLROnPlateau::is_better(double value) const {
  const double t = options_.threshold;
  if (options_.threshold_mode == "abs") return options_.mode == "min" ? value < best_ - t : value > best_ + t;
  return options_.mode == "min" ? value < best_ * (1.0 - t) : value > best_ * (1.0 + t);
}

nlohmann::json ReduceLROnPlateau::state_dict() const {
  nlohmann::json s = LRScheduler::state_dict();
  // JSON has no infinity: the initial best is stored as null.
  s["best"] = std::isfinite(best_) ? nlohmann::json(best_) : nlohmann::json(nullptr);
  s["num_bad"] = num_bad_;
  s["cooldown_left"] = cooldown_left_;
  return s;
}

void ReduceLROnPlateau::load_state_dict(const nlohmann::json& state) {
  LRScheduler::load_state_dict(state);
  if (!state.at("best").is_null()) best_ = state.at("best").get<double>();
  num_bad_ = counter_in(state, "num_bad");
  cooldown_left_ = counter_in(state, "cooldown_left");
}

}  // namespace fulgor
