#include "fulgor/optim/multiplicative_schedules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "fulgor/core/error.h"

namespace fulgor {

// Note [Exact arithmetic] in lr_scheduler.cpp: torch's operations, in its order.

namespace {

std::vector<double> scaled(std::vector<double> lrs, double factor) {
  for (double& lr : lrs) lr = lr * factor;
  return lrs;
}

}  // namespace

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor)
    : LRScheduler(optimizer), factor_(std::move(factor)) {
  if (!factor_) throw ConfigError("LambdaLR: the factor function is empty; expected a callable");
  initial_step();
}

std::vector<double> LambdaLR::get_lr() {
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(base * factor_(last_epoch_));
  return lrs;
}

MultiplicativeLR::MultiplicativeLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor)
    : LRScheduler(optimizer), factor_(std::move(factor)) {
  if (!factor_) throw ConfigError("MultiplicativeLR: the factor function is empty; expected a callable");
  initial_step();
}

std::vector<double> MultiplicativeLR::get_lr() {
  if (last_epoch_ <= 0) return current_lrs();
  std::vector<double> lrs;
  for (double lr : current_lrs()) lrs.push_back(lr * factor_(last_epoch_));
  return lrs;
}

StepLR::StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0) throw ConfigError(fmt::format("StepLR: step_size must be positive, got {}", step_size));
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return current_lrs();
  return scaled(current_lrs(), gamma_);
}

std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  return scaled(base_lrs_, std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_)));
}

MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  const auto hits = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  if (hits == 0) return current_lrs();
  return scaled(current_lrs(), std::pow(gamma_, static_cast<double>(hits)));
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  return scaled(base_lrs_, std::pow(gamma_, static_cast<double>(passed)));
}

ConstantLR::ConstantLR(torch::optim::Optimizer& optimizer, double factor, int64_t total_iters)
    : LRScheduler(optimizer), factor_(factor), total_iters_(total_iters) {
  if (factor > 1.0 || factor < 0)
    throw ConfigError(fmt::format("ConstantLR: factor={}: expected a value from 0 to 1", factor));
  initial_step();
}

std::vector<double> ConstantLR::get_lr() {
  if (last_epoch_ == 0) return scaled(current_lrs(), factor_);
  if (last_epoch_ != total_iters_) return current_lrs();
  return scaled(current_lrs(), 1.0 / factor_);
}

std::optional<std::vector<double>> ConstantLR::closed_form_lr() const {
  return scaled(base_lrs_, factor_ + (last_epoch_ >= total_iters_ ? 1.0 : 0.0) * (1 - factor_));
}

LinearLR::LinearLR(torch::optim::Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
  if (start_factor > 1.0 || start_factor <= 0)
    throw ConfigError(fmt::format("LinearLR: start_factor={}: expected a value above 0, at most 1", start_factor));
  if (end_factor > 1.0 || end_factor < 0)
    throw ConfigError(fmt::format("LinearLR: end_factor={}: expected a value from 0 to 1", end_factor));
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  if (last_epoch_ == 0) return scaled(current_lrs(), start_factor_);
  if (last_epoch_ > total_iters_) return current_lrs();
  const double delta = end_factor_ - start_factor_;
  const double denominator =
      static_cast<double>(total_iters_) * start_factor_ + static_cast<double>(last_epoch_ - 1) * delta;
  return scaled(current_lrs(), 1.0 + delta / denominator);
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  const double done = static_cast<double>(std::min(total_iters_, last_epoch_));
  return scaled(base_lrs_, start_factor_ + (end_factor_ - start_factor_) * done / static_cast<double>(total_iters_));
}

ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, double gamma) : LRScheduler(optimizer), gamma_(gamma) {
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() {
  if (last_epoch_ == 0) return current_lrs();
  return scaled(current_lrs(), gamma_);
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  return scaled(base_lrs_, std::pow(gamma_, static_cast<double>(last_epoch_)));
}

PolynomialLR::PolynomialLR(torch::optim::Optimizer& optimizer, int64_t total_iters, double power)
    : LRScheduler(optimizer), total_iters_(total_iters), power_(power) {
  if (total_iters <= 0)
    throw ConfigError(fmt::format("PolynomialLR: total_iters={}: expected a positive integer", total_iters));
  initial_step();
}

std::vector<double> PolynomialLR::get_lr() {
  if (last_epoch_ == 0 || last_epoch_ > total_iters_) return current_lrs();
  const double total = static_cast<double>(total_iters_);
  const double decay = std::pow(
      (1.0 - static_cast<double>(last_epoch_) / total) / (1.0 - static_cast<double>(last_epoch_ - 1) / total), power_);
  return scaled(current_lrs(), decay);
}

std::optional<std::vector<double>> PolynomialLR::closed_form_lr() const {
  const double done = static_cast<double>(std::min(total_iters_, last_epoch_));
  return scaled(base_lrs_, std::pow(1.0 - done / static_cast<double>(total_iters_), power_));
}

}  // namespace fulgor
