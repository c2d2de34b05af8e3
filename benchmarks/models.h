#pragma once

// The models the overhead benchmark runs: the same torch::nn::Sequential in
// the hand-written loop and inside a fulgor::Module.

#include <torch/torch.h>

#include <functional>
#include <string>

namespace fulgor::bench {

struct ModelSpec {
  std::string name;
  std::function<torch::nn::Sequential()> make;
  std::vector<int64_t> input_shape;  // one sample's
};

inline std::vector<ModelSpec> overhead_models() {
  namespace nn = torch::nn;
  return {
      {"linear 64-10", [] { return nn::Sequential(nn::Linear(64, 10)); }, {64}},
      {"mlp 64-128-10", [] { return nn::Sequential(nn::Linear(64, 128), nn::ReLU(), nn::Linear(128, 10)); }, {64}},
      // The Fashion-MNIST example's CNN.
      {"cnn fashion-mnist",
       [] {
         return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 16, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                               nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                               nn::Flatten(), nn::Linear(32 * 7 * 7, 64), nn::ReLU(), nn::Linear(64, 10));
       },
       {1, 28, 28}},
  };
}

}  // namespace fulgor::bench
