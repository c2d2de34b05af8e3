#pragma once

// ReduceLROnPlateau: the schedule that follows a monitored metric.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/optim/lr_scheduler.h"

namespace fulgor {

/// Options of ReduceLROnPlateau, with torch.optim's defaults.
struct PlateauOptions {
  std::string mode = "min";  ///< "min" or "max"
  double factor = 0.1;
  int64_t patience = 10;
  double threshold = 1e-4;  ///< improvement needed: relative, or absolute (threshold_mode)
  int64_t cooldown = 0;
  double min_lr = 0.0;
  std::string threshold_mode = "rel";  ///< "rel" or "abs"
  double eps = 1e-8;                   ///< a rate is left as it is when it would drop by no more
};

/// Multiplies the rates by `factor` when the monitored metric has not improved
/// for `patience` intervals (torch.optim.lr_scheduler.ReduceLROnPlateau).
/// Requires a SchedulerConfig with `monitor` set. An unknown mode or
/// threshold_mode, or a factor of 1 or more, is a ConfigError.
class FULGOR_API ReduceLROnPlateau : public LRScheduler {
 public:
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, PlateauOptions options = {});
  void step(std::optional<double> metric = std::nullopt) override;
  bool needs_metric() const override { return true; }
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override { return current_lrs(); }

 private:
  bool is_better(double value) const;

  PlateauOptions options_;
  double best_;
  int64_t num_bad_ = 0;
  int64_t cooldown_left_ = 0;
};

}  // namespace fulgor
