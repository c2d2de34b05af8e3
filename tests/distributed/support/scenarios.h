#pragma once

// The model and data the distributed workers train on, shared with the tests
// that recompute the expected results in one process.

#include <torch/torch.h>

#include <cstdint>

namespace fulgor::test {

constexpr int64_t kGlobalBatch = 32;
constexpr int64_t kFeatures = 4;

inline torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(kFeatures, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1));
}

/// `steps` global batches of kGlobalBatch samples: inputs and targets.
inline std::pair<torch::Tensor, torch::Tensor> make_data(int64_t steps) {
  torch::Generator generator = at::detail::createCPUGenerator(7);
  torch::Tensor x = torch::randn({steps * kGlobalBatch, kFeatures}, generator);
  torch::Tensor y = torch::randn({steps * kGlobalBatch, 1}, generator);
  return {x, y};
}

/// The seed rank `rank` initialises its model with: different on every rank,
/// so the tests see the initial broadcast take effect.
inline uint64_t init_seed(int64_t rank) { return 100 + static_cast<uint64_t>(rank); }

constexpr double kLearningRate = 0.1;

}  // namespace fulgor::test
