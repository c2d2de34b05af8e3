#pragma once

#include <cstdint>
#include <optional>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// The largest seed: Lightning's seed_everything takes seeds from 0 to
/// 2^32 - 1 (NumPy's range) and raises ValueError for any other. fulgor
/// refuses the same seeds, so that a seed means the same run in both.
inline constexpr uint64_t kMaxSeed = 4294967295u;

/// Throws ConfigError naming `seed` and the accepted range when it is above
/// kMaxSeed; `what` names where it was given ("seed_everything").
FULGOR_API void check_seed(uint64_t seed, const char* what);

/// Seeds LibTorch's CPU generator and the generators of every device of every
/// available registered accelerator (Accelerator::manual_seed), as Lightning's
/// seed_everything does; returns `seed`. Called before a module is built, it
/// makes the module's initialisation repeat, on the CPU and on whichever
/// device it is initialised on, and everything drawn after it.
///
/// Requires: seed <= kMaxSeed (else ConfigError, as Lightning's ValueError).
/// It asks each registered accelerator whether it is
/// available, which may load its runtime (docs/accelerators.md).
FULGOR_API uint64_t seed_everything(uint64_t seed);

/// The seed seed_everything last set in this process (Lightning's
/// PL_GLOBAL_SEED), or nullopt before the first call. The shards the Trainer
/// gives a fulgor::make_data_loader loader shuffle from it.
FULGOR_API std::optional<uint64_t> global_seed();

/// Seeds LibTorch's CPU generator, from which loaders shuffle and devices
/// without a generator of their own draw, and every device of `accelerator`:
/// what the Trainer's `seed` option does when a loop starts.
FULGOR_API void seed_accelerator(const Accelerator& accelerator, uint64_t seed);

}  // namespace fulgor
