#pragma once

// How a strategy tells a fulgor::Sharded unit that it shards it.

#include <memory>
#include <utility>

#include "fulgor/distributed/sharded_unit.h"

namespace fulgor::detail {

struct ShardedUnitAccess {
  static void set_sharding(ShardedUnit& unit, std::shared_ptr<UnitSharding> sharding) {
    unit.sharding_ = std::move(sharding);
  }
};

}  // namespace fulgor::detail
