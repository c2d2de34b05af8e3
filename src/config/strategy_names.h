#pragma once

#include <string>
#include <vector>

namespace fulgor::detail {

/// The strategy names TrainerOptions::strategy accepts.
const std::vector<std::string>& strategy_names();

/// Throws ConfigError listing the known names when `strategy` is not one.
void check_strategy(const std::string& strategy);

}  // namespace fulgor::detail
