#pragma once

// The schedules that scale the base rates by a factor: LambdaLR,
// MultiplicativeLR, StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR,
// PolynomialLR.

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/optim/lr_scheduler.h"

namespace fulgor {

/// Sets each rate to its base times `factor(last_epoch)` (torch.optim.lr_scheduler.LambdaLR).
class FULGOR_API LambdaLR : public LRScheduler {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor);

 protected:
  std::vector<double> get_lr() override;

 private:
  std::function<double(int64_t)> factor_;
};

/// Multiplies the rates by `factor(last_epoch)` at every step after the first
/// (torch.optim.lr_scheduler.MultiplicativeLR).
class FULGOR_API MultiplicativeLR : public LRScheduler {
 public:
  MultiplicativeLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor);

 protected:
  std::vector<double> get_lr() override;

 private:
  std::function<double(int64_t)> factor_;
};

/// Multiplies the rates by `gamma` every `step_size` intervals (torch.optim.lr_scheduler.StepLR).
class FULGOR_API StepLR : public LRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// Multiplies the rates by `gamma` at each milestone, by gamma^k at one listed
/// k times (torch.optim.lr_scheduler.MultiStepLR).
class FULGOR_API MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  std::vector<int64_t> milestones_;  // sorted, repeats kept
  double gamma_;
};

/// Multiplies the rates by `factor` for the first `total_iters` intervals
/// (torch.optim.lr_scheduler.ConstantLR). Requires 0 <= factor <= 1.
class FULGOR_API ConstantLR : public LRScheduler {
 public:
  explicit ConstantLR(torch::optim::Optimizer& optimizer, double factor = 1.0 / 3, int64_t total_iters = 5);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double factor_;
  int64_t total_iters_;
};

/// Scales the rates linearly from `start_factor` to `end_factor` over
/// `total_iters` intervals (torch.optim.lr_scheduler.LinearLR, the usual
/// warmup). Requires 0 < start_factor <= 1 and 0 <= end_factor <= 1.
class FULGOR_API LinearLR : public LRScheduler {
 public:
  explicit LinearLR(torch::optim::Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
                    int64_t total_iters = 5);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double start_factor_;
  double end_factor_;
  int64_t total_iters_;
};

/// Multiplies the rates by `gamma` every interval (torch.optim.lr_scheduler.ExponentialLR).
class FULGOR_API ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(torch::optim::Optimizer& optimizer, double gamma);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double gamma_;
};

/// Decays the rates polynomially to zero over `total_iters` intervals
/// (torch.optim.lr_scheduler.PolynomialLR).
class FULGOR_API PolynomialLR : public LRScheduler {
 public:
  explicit PolynomialLR(torch::optim::Optimizer& optimizer, int64_t total_iters = 5, double power = 1.0);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  int64_t total_iters_;
  double power_;
};

}  // namespace fulgor
