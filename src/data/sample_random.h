#pragma once

#include <cstdint>

namespace fulgor::detail {

// Note [Random choices by sample]
// A sample's random transforms draw from a generator keyed by (seed, epoch,
// index) alone, SplitMix64 over the three, so that the same sample in the
// same epoch is cropped and flipped alike whichever thread makes it, and
// whenever: a resumed run, or one with more workers, sees the same batches.
class SampleRandom {
 public:
  SampleRandom(uint64_t seed, int64_t epoch, int64_t index)
      : state_(mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index))) {}

  // Uniform in [lo, hi).
  double uniform(double lo, double hi) {
    const double unit = static_cast<double>(next() >> 11) * 0x1.0p-53;
    return lo + (hi - lo) * unit;
  }
  // Uniform in [0, n), n >= 1.
  int64_t below(int64_t n) { return static_cast<int64_t>(uniform(0.0, static_cast<double>(n))); }

 private:
  static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t next() { return mix(state_ += 0x9E3779B97F4A7C15ull); }

  uint64_t state_;
};

}  // namespace fulgor::detail
