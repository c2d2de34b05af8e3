#pragma once

#include <cstdint>
#include <vector>

namespace fulgor::detail {

// The order of one epoch over a data set read as streams (runs of
// consecutive indices of the given sizes), Note [Streamed shards]: the
// streams in an order drawn from (seed, epoch), each read through, and the
// samples passed through a shuffle buffer of `buffer` samples. Without
// `shuffle`, the indices in order.
std::vector<size_t> streamed_order(const std::vector<int64_t>& streams, int64_t buffer, bool shuffle, uint64_t seed,
                                   int64_t epoch);

}  // namespace fulgor::detail
