#pragma once

// The cosine schedules: CosineAnnealingLR and CosineAnnealingWarmRestarts.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/optim/lr_scheduler.h"

namespace fulgor {

/// Anneals the rates from their base to `eta_min` along half a cosine over
/// `T_max` intervals, and back up over the next T_max
/// (torch.optim.lr_scheduler.CosineAnnealingLR, its recursive form).
class FULGOR_API CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  int64_t T_max_;
  double eta_min_;
};

/// Cosine annealing restarted every T_i intervals, T_i starting at `T_0` and
/// multiplied by `T_mult` at each restart
/// (torch.optim.lr_scheduler.CosineAnnealingWarmRestarts).
class FULGOR_API CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, int64_t T_0, int64_t T_mult = 1,
                              double eta_min = 0.0);
  void step(std::optional<double> metric = std::nullopt) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 protected:
  std::vector<double> get_lr() override;
  void restart() override;

 private:
  int64_t T_0_;
  int64_t T_i_;
  int64_t T_mult_;
  double eta_min_;
  int64_t T_cur_ = -1;
};

}  // namespace fulgor
