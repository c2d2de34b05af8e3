#include "fulgor/optim/lr_scheduler.h"

#include <fmt/format.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "fulgor/core/error.h"
#include "optim/schedule_support.h"

namespace fulgor {

// Note [Exact arithmetic]
// Every rate is computed with the operations of torch/optim/lr_scheduler.py in
// their order, so that fulgor's sequences equal torch's to the last bits
// (tests/optim compares them with python3-torch's). Python's `a * b / c`
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

}  // namespace

namespace detail {

// Whether `optimizer`'s initial rates were taken by its only schedule.
bool sole_schedule(const torch::optim::Optimizer& optimizer) {
  std::lock_guard<std::mutex> lock(initial_rates_mutex);
  return initial_rates.at(&optimizer).schedules == 1;
}

std::vector<double> stored_initial_rates(const torch::optim::Optimizer& optimizer) {
  std::lock_guard<std::mutex> lock(initial_rates_mutex);
  return initial_rates.at(&optimizer).lrs;
}

// A counter of a scheduler's state, as a checkpoint gives it: within the
// range its steps can add to without overflow.
int64_t counter_in(const nlohmann::json& state, const char* key, int64_t min) {
  const auto value = state.at(key).get<int64_t>();
  if (value < min || value > (int64_t{1} << 62))
    throw ConfigError(fmt::format("scheduler state '{}' is {}: expected an integer from {} to 2^62", key, value, min));
  return value;
}

}  // namespace detail

using detail::counter_in;

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

}  // namespace fulgor
