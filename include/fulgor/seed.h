#pragma once

#include <cstdint>
#include <optional>

#include "fulgor/accelerator.h"

namespace fulgor {

/// Seeds LibTorch's CPU generator and the generators of every device of every
/// available registered accelerator (Accelerator::manual_seed), as Lightning's
/// seed_everything does; returns `seed`. Called before a module is built, it
/// makes the module's initialisation repeat, on the CPU and on whichever
/// device it is initialised on, and everything drawn after it.
///
/// Requires: nothing. It asks each registered accelerator whether it is
/// available, which may load its runtime (docs/accelerators.md).
uint64_t seed_everything(uint64_t seed);

/// The seed seed_everything last set in this process (Lightning's
/// PL_GLOBAL_SEED), or nullopt before the first call. The shards the Trainer
/// gives a fulgor::make_data_loader loader shuffle from it.
std::optional<uint64_t> global_seed();

/// Seeds LibTorch's CPU generator, from which loaders shuffle and devices
/// without a generator of their own draw, and every device of `accelerator`:
/// what the Trainer's `seed` option does when a loop starts.
void seed_accelerator(const Accelerator& accelerator, uint64_t seed);

}  // namespace fulgor
