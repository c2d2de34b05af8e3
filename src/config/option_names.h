#pragma once

#include <string>
#include <vector>

// The names some of TrainerOptions' strings accept (defined in
// trainer_options.cpp, which checks them).

namespace fulgor::detail {

/// The strategy names TrainerOptions::strategy accepts.
const std::vector<std::string>& strategy_names();

/// Throws ConfigError listing the known names when `strategy` is not one.
void check_strategy(const std::string& strategy);

/// Whether a TrainerOptions::profiler value names SimpleProfiler ("simple",
/// in any case, as Lightning reads it).
bool names_simple_profiler(std::string name);

}  // namespace fulgor::detail
