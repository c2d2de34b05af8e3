#pragma once

// What the distributed-checkpoint workers save and load: every rank holds
// its rows of two tensors (cut as torch.chunk cuts, so some pieces are
// short or empty), a tensor every rank holds whole, an object every rank
// gives and one of its own.

#include <fulgor/interop/distributed_checkpoint.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace fulgor::test {

struct DcpCase {
  torch::Tensor a, b, replicated;
};

inline DcpCase make_dcp_case() {
  torch::Generator g = at::detail::createCPUGenerator(17);
  return {torch::randn({7, 3}, g, torch::kFloat64), torch::randn({5}, g), torch::randn({4}, g, torch::kFloat64)};
}

/// The first row and the number of rows of rank `rank` of `n`.
inline std::pair<int64_t, int64_t> rows_of(int64_t rows, int64_t rank, int64_t n) {
  const int64_t chunk = (rows + n - 1) / n;
  const int64_t begin = std::min(rank * chunk, rows);
  return {begin, std::min(chunk, rows - begin)};
}

/// Rank `rank` of `n`'s state: its values, or zeros of their shapes to load
/// into (and then without the rank's own object, which another number of
/// ranks did not save).
inline DistributedStateDict dcp_state(int64_t rank, int64_t n, bool zeros) {
  DcpCase k = make_dcp_case();
  auto piece = [&](const std::string& name, const torch::Tensor& whole) {
    auto [begin, length] = rows_of(whole.size(0), rank, n);
    torch::Tensor local = whole.narrow(0, begin, length).clone();
    if (zeros) local.zero_();
    std::vector<int64_t> offsets(static_cast<size_t>(whole.dim()), 0);
    offsets[0] = begin;
    return DistributedCheckpointEntry{{std::string("model"), name}, local, TensorPlacement{offsets, whole.sizes().vec()}};
  };
  DistributedStateDict state{piece("a", k.a), piece("b", k.b)};
  state.push_back({{std::string("model"), std::string("replicated")},
                   zeros ? torch::zeros_like(k.replicated) : k.replicated, std::nullopt});
  state.push_back({{std::string("meta"), std::string("epoch")}, zeros ? int64_t{0} : int64_t{5}, std::nullopt});
  if (!zeros)
    state.push_back({{std::string("meta"), "rank" + std::to_string(rank)}, std::string("saved by ") + std::to_string(rank),
                     std::nullopt});
  return state;
}

}  // namespace fulgor::test
