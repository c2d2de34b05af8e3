#pragma once

// The models the overhead benchmarks run: the same torch::nn::Sequential in
// the hand-written loop and inside a fulgor::Module.

#include <torch/torch.h>

#include <functional>
#include <string>

#include "loops.h"

namespace fulgor::bench {

struct ModelSpec {
  std::string name;
  std::string key;  // the name in the JSON figures
  std::function<torch::nn::Sequential()> make;
  std::vector<int64_t> input_shape;  // one sample's

  /// `samples` random inputs of this model's shape with random labels (seed 0).
  Workload workload(int64_t samples, int64_t epochs) const {
    std::vector<int64_t> shape{samples};
    shape.insert(shape.end(), input_shape.begin(), input_shape.end());
    torch::manual_seed(0);
    auto data = torch::randn(shape);
    return {data, torch::randint(10, {samples}, torch::kLong), epochs};
  }
};

inline std::vector<ModelSpec> overhead_models() {
  namespace nn = torch::nn;
  return {
      {"linear 64-10", "linear", [] { return nn::Sequential(nn::Linear(64, 10)); }, {64}},
      {"mlp 64-128-10",
       "mlp",
       [] { return nn::Sequential(nn::Linear(64, 128), nn::ReLU(), nn::Linear(128, 10)); },
       {64}},
      // The Fashion-MNIST example's CNN.
      {"cnn fashion-mnist",
       "cnn",
       [] {
         return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 16, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                               nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                               nn::Flatten(), nn::Linear(32 * 7 * 7, 64), nn::ReLU(), nn::Linear(64, 10));
       },
       {1, 28, 28}},
  };
}

}  // namespace fulgor::bench
