#include "fulgor/optim/scheduler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "fulgor/core/error.h"

namespace fulgor {

// Note [Exact arithmetic]
// Every rate is computed with the operations of torch/optim/lr_scheduler.py in
// their order, so that fulgor's sequences equal torch's to the last bits
// (tests/schedulers compares them with python3-torch's). Python's `a * b / c`
// is (a * b) / c, its `%` is never negative for a positive divisor, and its
// int / int is a division of doubles. Most schedules are chainable, as torch's:
// each rate is computed from the optimizer's current one, so that schedules in
// a ChainedScheduler compose; where torch has a closed form, SequentialLR uses
// it to start a schedule at its milestone (torch's step(0)).
//
// Where torch 1.13 and 2.6 differ, fulgor follows 2.6: LinearLR refuses
// start_factor=0 (1.13 accepts it and then divides by zero); CyclicLR cycles
// Adam's beta1 (1.13 refuses an optimizer without `momentum`); SequentialLR
// undoes the initial step of nested ChainedSchedulers' schedules (1.13 undoes
// only its direct schedules'); SequentialLR and ChainedScheduler refuse
// ReduceLROnPlateau (1.13 fails at its first step).

namespace {

// Note [Initial rates]
// torch stores each group's rate as group["initial_lr"] when the first
// schedule of an optimizer is made, and every later schedule of that optimizer
// takes it as its base rate: a cosine made after a warmup (which has already
// scaled the rate) still anneals from the rate the user set. LibTorch's groups
// hold no extra keys, so fulgor keeps the initial rates beside the optimizer,
// for as long as one of its schedules lives; a group added later (a finetuning
// callback's) takes its rate then, as torch's setdefault does.
struct InitialRates {
  std::vector<double> lrs;
  int schedules = 0;
};
std::mutex initial_rates_mutex;
std::unordered_map<const torch::optim::Optimizer*, InitialRates> initial_rates;

std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

std::vector<double> adopt_initial_rates(const torch::optim::Optimizer& optimizer) {
  std::lock_guard<std::mutex> lock(initial_rates_mutex);
  auto& entry = initial_rates[&optimizer];
  ++entry.schedules;
  const auto lrs = group_lrs(optimizer);
  for (size_t i = entry.lrs.size(); i < lrs.size(); ++i) entry.lrs.push_back(lrs[i]);
  return entry.lrs;
}

void release_initial_rates(const torch::optim::Optimizer& optimizer) {
  std::lock_guard<std::mutex> lock(initial_rates_mutex);
  auto it = initial_rates.find(&optimizer);
  if (it != initial_rates.end() && --it->second.schedules == 0) initial_rates.erase(it);
}

// Whether `optimizer`'s initial rates were taken by its only schedule.
bool sole_schedule(const torch::optim::Optimizer& optimizer) {
  std::lock_guard<std::mutex> lock(initial_rates_mutex);
  return initial_rates.at(&optimizer).schedules == 1;
}

std::vector<double> stored_initial_rates(const torch::optim::Optimizer& optimizer) {
  std::lock_guard<std::mutex> lock(initial_rates_mutex);
  return initial_rates.at(&optimizer).lrs;
}

// Python's a % b for b > 0.
int64_t python_mod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

// A counter of a scheduler's state, as a checkpoint gives it: within the
// range its steps can add to without overflow.
int64_t counter_in(const nlohmann::json& state, const char* key, int64_t min = 0) {
  const auto value = state.at(key).get<int64_t>();
  if (value < min || value > (int64_t{1} << 62))
    throw ConfigError(fmt::format("scheduler state '{}' is {}: expected an integer from {} to 2^62", key, value, min));
  return value;
}

// One value per parameter group, from one for all or one for each (torch's _format_param).
std::vector<double> per_group(const char* schedule, const char* name, const std::vector<double>& values,
                              size_t groups) {
  if (values.size() == 1) return std::vector<double>(groups, values[0]);
  if (values.size() != groups)
    throw ConfigError(fmt::format("{}: {} has {} values; expected 1 or one per parameter group ({})", schedule, name,
                                  values.size(), groups));
  return values;
}

std::vector<double> scaled(std::vector<double> lrs, double factor) {
  for (double& lr : lrs) lr = lr * factor;
  return lrs;
}

// Note [Momentum or beta1]
// torch cycles group["momentum"] where the optimizer has one (SGD, RMSprop)
// and beta1 where it has betas (Adam, AdamW); other optimizers are refused.
struct Momentum {
  static bool supported(torch::optim::OptimizerOptions& o) {
    return dynamic_cast<torch::optim::SGDOptions*>(&o) || dynamic_cast<torch::optim::RMSpropOptions*>(&o) ||
           dynamic_cast<torch::optim::AdamOptions*>(&o) || dynamic_cast<torch::optim::AdamWOptions*>(&o);
  }
  static double get(torch::optim::OptimizerOptions& o) {
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) return sgd->momentum();
    if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) return rms->momentum();
    if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o)) return std::get<0>(adam->betas());
    return std::get<0>(dynamic_cast<torch::optim::AdamWOptions&>(o).betas());
  }
  static void set(torch::optim::OptimizerOptions& o, double m) {
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) {
      sgd->momentum(m);
    } else if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) {
      rms->momentum(m);
    } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o)) {
      adam->betas({m, std::get<1>(adam->betas())});
    } else {
      auto& adamw = dynamic_cast<torch::optim::AdamWOptions&>(o);
      adamw.betas({m, std::get<1>(adamw.betas())});
    }
  }
};

void require_momentum(const char* schedule, torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups())
    if (!Momentum::supported(group.options()))
      throw ConfigError(
          fmt::format("{}: cycle_momentum needs an optimizer with momentum or betas (SGD, RMSprop, "
                      "Adam, AdamW); set cycle_momentum = false for others",
                      schedule));
}

std::vector<double> group_momenta(torch::optim::Optimizer& optimizer) {
  std::vector<double> m;
  for (auto& group : optimizer.param_groups()) m.push_back(Momentum::get(group.options()));
  return m;
}

void set_momenta(torch::optim::Optimizer& optimizer, const std::vector<double>& momenta) {
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size() && i < momenta.size(); ++i) Momentum::set(groups[i].options(), momenta[i]);
}

}  // namespace

// ---- LRScheduler -------------------------------------------------------------

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer)
    : optimizer_(optimizer), base_lrs_(adopt_initial_rates(optimizer)), last_lr_(group_lrs(optimizer)) {}

LRScheduler::~LRScheduler() { release_initial_rates(optimizer_); }

void LRScheduler::step(std::optional<double>) {
  ++step_count_;
  ++last_epoch_;
  apply(get_lr());
}

void LRScheduler::restart() {
  ++step_count_;
  last_epoch_ = 0;
  auto closed = closed_form_lr();
  apply(closed ? *closed : get_lr());
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  step();
}

std::vector<double> LRScheduler::current_lrs() const { return group_lrs(optimizer_); }

void LRScheduler::apply(const std::vector<double>& lrs) {
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size() && i < lrs.size(); ++i) groups[i].options().set_lr(lrs[i]);
  last_lr_ = current_lrs();
}

void LRScheduler::set_initial_lrs(const std::vector<double>& lrs) {
  std::lock_guard<std::mutex> lock(initial_rates_mutex);
  initial_rates.at(&optimizer_).lrs = lrs;
}

nlohmann::json LRScheduler::state_dict() const {
  return {{"last_epoch", last_epoch_}, {"step_count", step_count_}, {"base_lrs", base_lrs_}, {"last_lr", last_lr_}};
}

// The rates are restored from the state, as torch's come back with the
// optimizer's param_groups.
void LRScheduler::load_state_dict(const nlohmann::json& state) {
  last_epoch_ = counter_in(state, "last_epoch", -1);
  step_count_ = counter_in(state, "step_count");
  base_lrs_ = state.at("base_lrs").get<std::vector<double>>();
  apply(state.at("last_lr").get<std::vector<double>>());
}

// ---- The multiplicative schedules -------------------------------------------

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

// ---- The cosine schedules ---------------------------------------------------

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

// ---- The cyclic schedules ---------------------------------------------------

CyclicLR::CyclicLR(torch::optim::Optimizer& optimizer, CyclicOptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  const size_t groups = optimizer.param_groups().size();
  const auto base = per_group("CyclicLR", "base_lr", options_.base_lr, groups);
  max_lrs_ = per_group("CyclicLR", "max_lr", options_.max_lr, groups);
  const double up = options_.step_size_up, down = options_.step_size_down.value_or(up);
  if (!(up > 0) || !(down >= 0))
    throw ConfigError(
        fmt::format("CyclicLR: step_size_up={}, step_size_down={}: expected up > 0 and down >= 0", up, down));
  total_size_ = up + down;
  step_ratio_ = up / total_size_;
  const auto& mode = options_.mode;
  if (!options_.scale_fn && mode != "triangular" && mode != "triangular2" && mode != "exp_range")
    throw ConfigError(fmt::format(
        "CyclicLR: mode \"{}\": expected \"triangular\", \"triangular2\" or \"exp_range\", or a scale_fn", mode));
  if (options_.scale_fn && options_.scale_mode != "cycle" && options_.scale_mode != "iterations")
    throw ConfigError(
        fmt::format("CyclicLR: scale_mode \"{}\": expected \"cycle\" or \"iterations\"", options_.scale_mode));
  if (!options_.scale_fn) options_.scale_mode = mode == "exp_range" ? "iterations" : "cycle";
  // torch sets the rates to base_lr before its base constructor takes them as
  // the initial rates of an optimizer that has none yet.
  if (sole_schedule(optimizer)) set_initial_lrs(base);
  apply(base);
  base_lrs_ = stored_initial_rates(optimizer);
  if (options_.cycle_momentum) {
    require_momentum("CyclicLR", optimizer);
    base_momentums_ = per_group("CyclicLR", "base_momentum", options_.base_momentum, groups);
    max_momentums_ = per_group("CyclicLR", "max_momentum", options_.max_momentum, groups);
    set_momenta(optimizer, max_momentums_);
  }
  initial_step();
  base_lrs_ = base;
}

double CyclicLR::scale(double x) const {
  if (options_.scale_fn) return options_.scale_fn(x);
  if (options_.mode == "triangular") return 1.0;
  if (options_.mode == "triangular2") return 1 / std::pow(2.0, x - 1);
  return std::pow(options_.gamma, x);
}

std::vector<double> CyclicLR::get_lr() {
  const double e = static_cast<double>(last_epoch_);
  const double cycle = std::floor(1 + e / total_size_);
  const double x = 1.0 + e / total_size_ - cycle;
  const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  const double s = scale(options_.scale_mode == "cycle" ? cycle : e);
  std::vector<double> lrs;
  for (size_t i = 0; i < base_lrs_.size(); ++i) {
    const double base_height = (max_lrs_[i] - base_lrs_[i]) * scale_factor;
    lrs.push_back(base_lrs_[i] + base_height * s);
  }
  if (options_.cycle_momentum) {
    std::vector<double> momenta;
    for (size_t i = 0; i < base_momentums_.size(); ++i) {
      const double base_height = (max_momentums_[i] - base_momentums_[i]) * scale_factor;
      momenta.push_back(max_momentums_[i] - base_height * s);
    }
    set_momenta(optimizer_, momenta);
  }
  return lrs;
}

nlohmann::json CyclicLR::state_dict() const {
  auto s = LRScheduler::state_dict();
  if (options_.cycle_momentum) s["last_momentum"] = group_momenta(optimizer_);
  return s;
}

void CyclicLR::load_state_dict(const nlohmann::json& state) {
  LRScheduler::load_state_dict(state);
  if (options_.cycle_momentum) set_momenta(optimizer_, state.at("last_momentum").get<std::vector<double>>());
}

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleOptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  const auto& o = options_;
  if (o.total_steps) {
    if (*o.total_steps <= 0)
      throw ConfigError(fmt::format("OneCycleLR: total_steps={}: expected a positive integer", *o.total_steps));
    total_steps_ = *o.total_steps;
  } else if (o.epochs && o.steps_per_epoch) {
    if (*o.epochs <= 0 || *o.steps_per_epoch <= 0)
      throw ConfigError(fmt::format("OneCycleLR: epochs={}, steps_per_epoch={}: expected positive integers", *o.epochs,
                                    *o.steps_per_epoch));
    total_steps_ = *o.epochs * *o.steps_per_epoch;
  } else {
    throw ConfigError("OneCycleLR: give total_steps, or epochs and steps_per_epoch");
  }
  if (o.pct_start < 0 || o.pct_start > 1)
    throw ConfigError(fmt::format("OneCycleLR: pct_start={}: expected a value from 0 to 1", o.pct_start));
  if (o.anneal_strategy != "cos" && o.anneal_strategy != "linear")
    throw ConfigError(
        fmt::format("OneCycleLR: anneal_strategy \"{}\": expected \"cos\" or \"linear\"", o.anneal_strategy));
  const double total = static_cast<double>(total_steps_);
  const double up_end = o.pct_start * total - 1;
  // Rates: 0 initial, 1 max, 2 min; momenta: 0 max, 1 base.
  if (o.three_phase)
    phases_ = {{up_end, 0, 1, 0, 1}, {2 * o.pct_start * total - 2, 1, 0, 1, 0}, {total - 1, 0, 2, 0, 0}};
  else
    phases_ = {{up_end, 0, 1, 0, 1}, {total - 1, 1, 2, 1, 0}};
  const size_t groups = optimizer.param_groups().size();
  std::vector<double> initial;
  for (double max : per_group("OneCycleLR", "max_lr", o.max_lr, groups)) {
    const double start = max / o.div_factor;
    initial.push_back(start);
    rates_.push_back({start, max, start / o.final_div_factor});
  }
  set_initial_lrs(initial);
  base_lrs_ = initial;
  if (o.cycle_momentum) {
    require_momentum("OneCycleLR", optimizer);
    const auto max = per_group("OneCycleLR", "max_momentum", o.max_momentum, groups);
    const auto base = per_group("OneCycleLR", "base_momentum", o.base_momentum, groups);
    for (size_t i = 0; i < groups; ++i) momenta_.push_back({max[i], base[i]});
    set_momenta(optimizer, max);
  }
  initial_step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy == "cos") {
    const double cos_out = std::cos(M_PI * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

std::vector<double> OneCycleLR::get_lr() {
  if (last_epoch_ > total_steps_)
    throw ConfigError(fmt::format("OneCycleLR: stepped {} times; total_steps is {}", last_epoch_, total_steps_));
  const double step = static_cast<double>(last_epoch_);
  double start_step = 0.0;
  const Phase* phase = &phases_.back();
  for (const auto& p : phases_) {
    if (step <= p.end_step) {
      phase = &p;
      break;
    }
    if (&p != &phases_.back()) start_step = p.end_step;
  }
  if (phase->end_step == start_step)
    throw ConfigError(fmt::format("OneCycleLR: a phase of no steps (pct_start={}, total_steps={})", options_.pct_start,
                                  total_steps_));
  const double pct = (step - start_step) / (phase->end_step - start_step);
  std::vector<double> lrs, momenta;
  for (size_t i = 0; i < rates_.size(); ++i) {
    lrs.push_back(anneal(rates_[i][phase->start], rates_[i][phase->end], pct));
    if (options_.cycle_momentum)
      momenta.push_back(anneal(momenta_[i][phase->start_momentum], momenta_[i][phase->end_momentum], pct));
  }
  if (options_.cycle_momentum) set_momenta(optimizer_, momenta);
  return lrs;
}

nlohmann::json OneCycleLR::state_dict() const {
  auto s = LRScheduler::state_dict();
  if (options_.cycle_momentum) s["last_momentum"] = group_momenta(optimizer_);
  return s;
}

void OneCycleLR::load_state_dict(const nlohmann::json& state) {
  LRScheduler::load_state_dict(state);
  if (options_.cycle_momentum) set_momenta(optimizer_, state.at("last_momentum").get<std::vector<double>>());
}

// ---- The composite schedules ------------------------------------------------

namespace {
void check_parts(const char* composite, const torch::optim::Optimizer& optimizer,
                 const std::vector<std::shared_ptr<LRScheduler>>& schedulers) {
  if (schedulers.empty()) throw ConfigError(fmt::format("{}: no schedulers; expected at least one", composite));
  for (size_t i = 0; i < schedulers.size(); ++i) {
    if (!schedulers[i]) throw ConfigError(fmt::format("{}: scheduler {} is null", composite, i));
    if (schedulers[i]->needs_metric())
      throw ConfigError(
          fmt::format("{}: scheduler {} needs a monitored metric (ReduceLROnPlateau), which {} cannot "
                      "pass; expected schedules that step without one",
                      composite, i, composite));
    if (&schedulers[i]->optimizer() != &optimizer)
      throw ConfigError(
          fmt::format("{}: scheduler {} sets another optimizer's rates; expected all on one optimizer", composite, i));
  }
}

nlohmann::json part_states(const std::vector<std::shared_ptr<LRScheduler>>& schedulers) {
  auto states = nlohmann::json::array();
  for (const auto& s : schedulers) states.push_back(s->state_dict());
  return states;
}

void load_parts(const char* composite, const std::vector<std::shared_ptr<LRScheduler>>& schedulers,
                const nlohmann::json& states) {
  if (!states.is_array() || states.size() != schedulers.size())
    throw ConfigError(
        fmt::format("{} state holds {}; expected {} scheduler states", composite, states.dump(), schedulers.size()));
  for (size_t i = 0; i < schedulers.size(); ++i) schedulers[i]->load_state_dict(states[i]);
}
}  // namespace

SequentialLR::SequentialLR(torch::optim::Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  check_parts("SequentialLR", optimizer, schedulers_);
  for (size_t i = 1; i < schedulers_.size(); ++i)
    if (dynamic_cast<SequentialLR*>(schedulers_[i].get()) || dynamic_cast<ChainedScheduler*>(schedulers_[i].get()))
      throw ConfigError(
          fmt::format("SequentialLR: scheduler {} is composite, which cannot start at a milestone; "
                      "expected a composite schedule first only",
                      i));
  if (milestones_.size() + 1 != schedulers_.size())
    throw ConfigError(fmt::format("SequentialLR: {} milestones for {} schedulers; expected one fewer milestone",
                                  milestones_.size(), schedulers_.size()));
  if (!std::is_sorted(milestones_.begin(), milestones_.end()))
    throw ConfigError(fmt::format("SequentialLR: milestones {}: expected ascending", milestones_));
  last_epoch_ = 0;
  apply(base_lrs_);
  undo_initial_step();
  schedulers_[0]->initial_step();
  last_lr_ = schedulers_[0]->get_last_lr();
}

void SequentialLR::undo_initial_step() {
  for (auto& s : schedulers_) s->undo_initial_step();
}

void SequentialLR::step(std::optional<double>) {
  ++last_epoch_;
  const auto idx = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  auto& scheduler = *schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_)
    scheduler.restart();
  else
    scheduler.step();
  last_lr_ = scheduler.get_last_lr();
}

nlohmann::json SequentialLR::state_dict() const {
  return {{"last_epoch", last_epoch_}, {"last_lr", last_lr_}, {"schedulers", part_states(schedulers_)}};
}

void SequentialLR::load_state_dict(const nlohmann::json& state) {
  last_epoch_ = counter_in(state, "last_epoch");
  load_parts("SequentialLR", schedulers_, state.at("schedulers"));
  apply(state.at("last_lr").get<std::vector<double>>());
}

namespace {
torch::optim::Optimizer& first_optimizer(const std::vector<std::shared_ptr<LRScheduler>>& schedulers) {
  if (schedulers.empty() || !schedulers[0])
    throw ConfigError("ChainedScheduler: no first scheduler; expected at least one");
  return const_cast<torch::optim::Optimizer&>(schedulers[0]->optimizer());
}
}  // namespace

ChainedScheduler::ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : LRScheduler(first_optimizer(schedulers)), schedulers_(std::move(schedulers)) {
  check_parts("ChainedScheduler", optimizer_, schedulers_);
}

void ChainedScheduler::undo_initial_step() {
  for (auto& s : schedulers_) s->undo_initial_step();
}

void ChainedScheduler::step(std::optional<double>) {
  ++last_epoch_;
  for (auto& s : schedulers_) s->step();
  last_lr_ = current_lrs();
}

nlohmann::json ChainedScheduler::state_dict() const {
  return {{"last_epoch", last_epoch_}, {"last_lr", last_lr_}, {"schedulers", part_states(schedulers_)}};
}

void ChainedScheduler::load_state_dict(const nlohmann::json& state) {
  last_epoch_ = counter_in(state, "last_epoch", -1);
  load_parts("ChainedScheduler", schedulers_, state.at("schedulers"));
  apply(state.at("last_lr").get<std::vector<double>>());
}

// ---- ReduceLROnPlateau ------------------------------------------------------

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
