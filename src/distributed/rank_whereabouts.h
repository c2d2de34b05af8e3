#pragma once

// Note [Naming the ranks that did not arrive]
// When a collective times out or loses a peer, c10d says only that: Gloo
// names a socket, not the rank that stopped. So each rank whose collective
// fails posts where it is (its count of collectives and the collective's
// name) to the job's store, and reads the others' posts for a bounded while:
// a rank that posts nothing did not arrive (it died, is stopped, or is busy
// outside collectives, which no timeout can tell apart); one that posts
// another collective called the collectives in another order. Rank 0 hosts
// the store, so the posting runs on a thread of its own: when rank 0 is the
// rank that stopped, the others give up on it after the same bounded while;
// when rank 0 posted and then ended (failing too, a little before them), the
// store closes under the others' reading, and what they read until then
// stands.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fulgor::detail {

/// Where the other ranks were when this rank's collective failed.
struct RankWhereabouts {
  bool known = false;
  std::string unknown_because;                             // why not, when !known
  std::vector<int64_t> absent;                             // posted nothing within the while
  std::vector<int64_t> waiting;                            // failed in the same collective
  std::vector<std::pair<int64_t, std::string>> elsewhere;  // failed in another: the rank and "name (number N)"
};

/// Posts this rank's `sequence` (its count of collectives) and `collective`,
/// and collects the other ranks' posts for at most `slack`.
RankWhereabouts find_whereabouts(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t size,
                                 int64_t sequence, const std::string& collective, std::chrono::milliseconds slack);

/// "rank 2", "ranks 1 and 3", "ranks 1, 2 and 3".
std::string name_ranks(const std::vector<int64_t>& ranks);

}  // namespace fulgor::detail
