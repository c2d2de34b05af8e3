#include "fulgor/optim/cosine_schedules.h"

#include <fmt/format.h>

#include <cmath>

#include "fulgor/core/error.h"
#include "optim/schedule_support.h"

namespace fulgor {

// Note [Exact arithmetic] in lr_scheduler.cpp: torch's operations, in its order.

namespace {

// Python's a % b for b > 0.
int64_t python_mod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

}  // namespace

using detail::counter_in;

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer), T_max_(T_max), eta_min_(eta_min) {
  if (T_max <= 0) throw ConfigError(fmt::format("CosineAnnealingLR: T_max={}: expected a positive integer", T_max));
  initial_step();
}

// torch's branch for a schedule made with last_epoch > 0 is left out: fulgor
// resumes through load_state_dict instead.
std::vector<double> CosineAnnealingLR::get_lr() {
  if (last_epoch_ == 0) return current_lrs();
  const double pi = M_PI, T = static_cast<double>(T_max_), e = static_cast<double>(last_epoch_);
  std::vector<double> lrs = current_lrs();
  if (python_mod(last_epoch_ - 1 - T_max_, 2 * T_max_) == 0) {
    for (size_t i = 0; i < lrs.size(); ++i) lrs[i] = lrs[i] + (base_lrs_[i] - eta_min_) * (1 - std::cos(pi / T)) / 2;
    return lrs;
  }
  for (double& lr : lrs)
    lr = (1 + std::cos(pi * e / T)) / (1 + std::cos(pi * (e - 1) / T)) * (lr - eta_min_) + eta_min_;
  return lrs;
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  const double pi = M_PI, T = static_cast<double>(T_max_), e = static_cast<double>(last_epoch_);
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(eta_min_ + (base - eta_min_) * (1 + std::cos(pi * e / T)) / 2);
  return lrs;
}

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, int64_t T_0,
                                                         int64_t T_mult, double eta_min)
    : LRScheduler(optimizer), T_0_(T_0), T_i_(T_0), T_mult_(T_mult), eta_min_(eta_min) {
  if (T_0 <= 0) throw ConfigError(fmt::format("CosineAnnealingWarmRestarts: T_0={}: expected a positive integer", T_0));
  if (T_mult < 1)
    throw ConfigError(fmt::format("CosineAnnealingWarmRestarts: T_mult={}: expected an integer >= 1", T_mult));
  initial_step();
}

std::vector<double> CosineAnnealingWarmRestarts::get_lr() {
  const double pi = M_PI, t = static_cast<double>(T_cur_), T = static_cast<double>(T_i_);
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(eta_min_ + (base - eta_min_) * (1 + std::cos(pi * t / T)) / 2);
  return lrs;
}

void CosineAnnealingWarmRestarts::step(std::optional<double>) {
  if (last_epoch_ < 0) return restart();
  ++step_count_;
  ++last_epoch_;
  if (++T_cur_ >= T_i_) {
    T_cur_ -= T_i_;
    T_i_ *= T_mult_;
  }
  apply(get_lr());
}

// torch's step(epoch=0).
void CosineAnnealingWarmRestarts::restart() {
  ++step_count_;
  T_i_ = T_0_;
  T_cur_ = 0;
  last_epoch_ = 0;
  apply(get_lr());
}

nlohmann::json CosineAnnealingWarmRestarts::state_dict() const {
  auto s = LRScheduler::state_dict();
  s["T_i"] = T_i_;
  s["T_cur"] = T_cur_;
  return s;
}

void CosineAnnealingWarmRestarts::load_state_dict(const nlohmann::json& state) {
  T_i_ = counter_in(state, "T_i", 1);
  T_cur_ = counter_in(state, "T_cur", -1);
  LRScheduler::load_state_dict(state);
}

}  // namespace fulgor
