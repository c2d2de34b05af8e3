#include "data/stream_order.h"

#include <numeric>
#include <utility>

#include "data/sample_random.h"

namespace fulgor::detail {

// Note [Streamed shards]
// Shards without an index are read as WebDataset reads them: each in order,
// the shards' order shuffled, then a shuffle buffer (WebDataset's
// shuffle(n)): the first `buffer` samples fill it, each next one takes the
// place of a uniformly drawn one, which is emitted; at the end the rest
// leave in a random order. Reads stay sequential within a few shards.
// Unlike WebDataset, the draws come from (seed, epoch) alone, not from a
// process's generator, so the epoch's order is a function of them, known
// before the first read: the loader shards it between ranks and resumes it
// mid-epoch exactly as it does a permutation.
std::vector<size_t> streamed_order(const std::vector<int64_t>& streams, int64_t buffer, bool shuffle, uint64_t seed,
                                   int64_t epoch) {
  std::vector<size_t> starts(streams.size());
  size_t total = 0;
  for (size_t s = 0; s < streams.size(); ++s) {
    starts[s] = total;
    total += static_cast<size_t>(streams[s]);
  }
  std::vector<size_t> order;
  order.reserve(total);
  if (!shuffle) {
    order.resize(total);
    std::iota(order.begin(), order.end(), size_t{0});
    return order;
  }
  // An index no sample has keys the epoch's draws apart from the samples' own.
  SampleRandom random(seed, epoch, -1);
  std::vector<size_t> shards(streams.size());
  std::iota(shards.begin(), shards.end(), size_t{0});
  for (size_t i = shards.size(); i > 1; --i)
    std::swap(shards[i - 1], shards[static_cast<size_t>(random.below(static_cast<int64_t>(i)))]);
  std::vector<size_t> held;
  held.reserve(static_cast<size_t>(buffer));
  for (const size_t s : shards)
    for (int64_t i = 0; i < streams[s]; ++i) {
      const size_t index = starts[s] + static_cast<size_t>(i);
      if (static_cast<int64_t>(held.size()) < buffer) {
        held.push_back(index);
        continue;
      }
      const auto k = static_cast<size_t>(random.below(buffer));
      order.push_back(std::exchange(held[k], index));
    }
  while (!held.empty()) {
    const auto k = static_cast<size_t>(random.below(static_cast<int64_t>(held.size())));
    order.push_back(held[k]);
    held[k] = held.back();
    held.pop_back();
  }
  return order;
}

}  // namespace fulgor::detail
