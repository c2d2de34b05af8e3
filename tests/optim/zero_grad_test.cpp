// Gradients set to none, as PyTorch 2's optimizer.zero_grad() does, wherever
// fulgor clears them: fulgor::zero_grad itself, the Trainer's
// optimizer_zero_grad, manual optimization and Fabric, on LibTorch 1.13 too.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace zero_grad_test {

using fulgor::testing::quiet;
using fulgor::testing::sequential_loader;
using fulgor::testing::TempDir;

torch::optim::SGD sgd_with_gradients(torch::nn::Linear& layer) {
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  layer->forward(torch::ones({2, 3})).sum().backward();
  return sgd;
}

TEST(ZeroGrad, SetsGradientsToNone) {
  torch::nn::Linear layer(3, 2);
  auto sgd = sgd_with_gradients(layer);
  fulgor::zero_grad(sgd);
  for (const auto& p : layer->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(ZeroGrad, ZeroesInPlaceWhenAskedNotToSetToNone) {
  torch::nn::Linear layer(3, 2);
  auto sgd = sgd_with_gradients(layer);
  const void* memory = layer->weight.grad().data_ptr();
  fulgor::zero_grad(sgd, /*set_to_none=*/false);
  EXPECT_EQ(layer->weight.grad().data_ptr(), memory);
  for (const auto& p : layer->parameters()) EXPECT_EQ(p.grad().count_nonzero().item<int64_t>(), 0);
}

// A head reached by the first batch only: after the first step it gets no
// gradient, so Adam leaves it where the first step put it (a zeroed gradient
// would keep moving it by the first step's momentum). The module's
// on_before_backward sees no gradient left from the previous step.
struct TwoHeads : fulgor::Module {
  torch::nn::Linear body{nullptr}, first_only{nullptr};
  torch::Tensor after_first_step;
  int64_t backwards_with_old_gradients = 0;

  TwoHeads() {
    body = register_module("body", torch::nn::Linear(4, 1));
    first_only = register_module("first_only", torch::nn::Linear(4, 1));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    torch::Tensor prediction = body(batch.data);
    if (batch_idx == 0) prediction = prediction + first_only(batch.data);
    return torch::mse_loss(prediction, batch.target);
  }
  void on_before_backward(const torch::Tensor&) override {
    for (const auto& p : parameters()) backwards_with_old_gradients += p.grad().defined();
  }
  void on_train_batch_end(const torch::Tensor&, int64_t batch_idx) override {
    if (batch_idx == 0) after_first_step = first_only->weight.detach().clone();
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01));
  }
};

TEST(ZeroGrad, TheTrainerDoesNotStepAParameterThatAPassDidNotReach) {
  TempDir dir;
  torch::manual_seed(0);
  TwoHeads model;
  const torch::Tensor initial = model.first_only->weight.detach().clone();
  auto train = sequential_loader(32, 8);
  fulgor::Trainer(quiet(dir, 1)).fit(model, train);
  ASSERT_TRUE(model.after_first_step.defined());
  EXPECT_FALSE(torch::equal(model.after_first_step, initial));
  EXPECT_TRUE(torch::equal(model.first_only->weight, model.after_first_step));
  EXPECT_EQ(model.backwards_with_old_gradients, 0);
}

// Manual optimization's zero_grad sets to none too, or zeroes when asked.
struct ManualClearing : fulgor::Module {
  torch::nn::Linear layer{nullptr};
  int64_t defined_after_clearing = 0, nonzero_after_zeroing = 0;

  ManualClearing() {
    layer = register_module("layer", torch::nn::Linear(4, 1));
    set_automatic_optimization(false);
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    auto& optimizer = optimizers()[0];
    manual_backward(torch::mse_loss(layer(batch.data), batch.target));
    optimizer.step();
    if (batch_idx % 2 == 0) {
      optimizer.zero_grad();
      for (const auto& p : parameters()) defined_after_clearing += p.grad().defined();
    } else {
      optimizer.zero_grad(/*set_to_none=*/false);
      for (const auto& p : parameters()) nonzero_after_zeroing += p.grad().count_nonzero().item<int64_t>();
    }
    return {};
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
};

TEST(ZeroGrad, ManualOptimizationSetsToNoneOrZeroes) {
  TempDir dir;
  ManualClearing model;
  auto train = sequential_loader(32, 8);
  fulgor::Trainer(quiet(dir, 1)).fit(model, train);
  EXPECT_EQ(model.defined_after_clearing, 0);
  EXPECT_EQ(model.nonzero_after_zeroing, 0);
  EXPECT_TRUE(model.layer->weight.grad().defined());  // the last batch's, zeroed in place
}

TEST(ZeroGrad, FabricsOptimizerSetsToNone) {
  fulgor::Fabric fabric({.accelerator = "cpu", .devices = 1});
  fabric.launch();
  torch::nn::Linear layer(3, 2);
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  auto optimizer = fabric.setup(layer, sgd);
  fabric.backward(layer->forward(torch::ones({2, 3}, torch::kFloat)).sum());
  optimizer.step();
  optimizer.zero_grad();
  for (const auto& p : layer->parameters()) EXPECT_FALSE(p.grad().defined());
}

}  // namespace zero_grad_test
