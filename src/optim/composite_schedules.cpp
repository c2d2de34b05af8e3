#include "fulgor/optim/composite_schedules.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "fulgor/core/error.h"
#include "optim/schedule_support.h"

namespace fulgor {

using detail::counter_in;

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

}  // namespace fulgor
