#pragma once

// What the schedule families share, defined with their base in
// lr_scheduler.cpp.

#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace fulgor::detail {

// The initial rates kept beside an optimizer (Note [Initial rates] in
// lr_scheduler.cpp): whether its only schedule took them, and what they are.
bool sole_schedule(const torch::optim::Optimizer& optimizer);
std::vector<double> stored_initial_rates(const torch::optim::Optimizer& optimizer);

// A counter of a scheduler's state, as a checkpoint gives it: within the
// range its steps can add to without overflow.
int64_t counter_in(const nlohmann::json& state, const char* key, int64_t min = 0);

}  // namespace fulgor::detail
