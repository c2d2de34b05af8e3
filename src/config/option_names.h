#pragma once

#include <string>
#include <vector>

// The names some of TrainerOptions' strings accept (defined in
// trainer_options.cpp, which checks them).

namespace fulgor {
struct TrainerOptions;
}

namespace fulgor::detail {

/// The strategy names TrainerOptions::strategy accepts.
const std::vector<std::string>& strategy_names();

/// Throws ConfigError listing the known names when `strategy` is not one.
void check_strategy(const std::string& strategy);

/// The sharding_strategy `name` in upper case, as Lightning reads it; throws
/// ConfigError for an unknown name.
std::string sharding_strategy_name(std::string name);

/// Throws ConfigError for sharding options that do not go together: the
/// Trainer's and Fabric's fields of those names.
void check_sharding(const std::string& strategy, const std::string& sharding_strategy, bool zero_redundancy_optimizer);

/// Throws ConfigError unless `state_dict_type` is "full" or "sharded": the
/// Trainer's and Fabric's field of that name.
void check_state_dict_type(const std::string& state_dict_type);

/// Whether a TrainerOptions::profiler value names SimpleProfiler ("simple",
/// in any case, as Lightning reads it).
bool names_simple_profiler(std::string name);

}  // namespace fulgor::detail
