// The code docs/training.md shows for the callbacks, compiled as written
// (extracted at build time, tests/CMakeLists.txt) and run.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <vector>

#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {
#include "batch_size_data.h"  // docs/training.md's Data and fit_largest_batches, as written there
#include "lr_find_recipe.h"   // docs/training.md's LitRecipe and train_recipe, as written there

double mean_squared_error(LitRecipe& model, const torch::Tensor& x, const torch::Tensor& y) {
  torch::NoGradGuard no_grad;
  return torch::mse_loss(model.net->forward(x), y).item<double>();
}

TEST(DocsRecipe, LearningRateFinderThenWarmupCosineAndEma) {
  TempDir dir;
  torch::manual_seed(0);
  LitRecipe model(1e-3, 10, 80);
  XY data(1280, 7);
  const double before = mean_squared_error(model, data.x, data.y);
  auto loader = shuffled_loader(1280, 32);  // 40 batches an epoch: 80 steps in 2 epochs
  auto options = quiet(dir, 2);
  std::shared_ptr<EMAWeightAveraging> ema;
  options.callbacks.push_back(
      std::make_shared<LambdaCallback>(LambdaHooks{.on_train_end = [&](Trainer& trainer, ModuleBase&) {
        for (const auto& cb : trainer.callbacks())
          if (auto found = std::dynamic_pointer_cast<EMAWeightAveraging>(cb)) ema = found;
      }}));
  const FitResult result = train_recipe(model, loader, options);
  EXPECT_EQ(result.global_step, 80);
  // The finder's suggestion became the rate the schedules start from.
  const double lr = model.hparams()["lr"].get<double>();
  EXPECT_NE(lr, 1e-3);
  EXPECT_GT(lr, 1e-5);
  EXPECT_LT(lr, 1.0);
  // The average took the steps from the warmup's end on, and the module holds it.
  ASSERT_TRUE(ema && ema->average_model());
  EXPECT_EQ(ema->average_model()->n_averaged(), 80 - 10);
  const auto& averaged = ema->average_model()->tensors();
  ASSERT_EQ(averaged.size(), 2u);
  EXPECT_TRUE(torch::equal(model.net->weight, averaged[0]));
  EXPECT_TRUE(torch::equal(model.net->bias, averaged[1]));
  EXPECT_LT(mean_squared_error(model, data.x, data.y), before);
}

TEST(DocsRecipe, WeightAveragingSnippet) {
  TempDir dir;
  TrainerOptions trainer_options = quiet(dir, 2);
  {
#include "ema_options.h"  // docs/training.md's EMAWeightAveraging options, as written there
  } ASSERT_EQ(trainer_options.callbacks.size(), 1u);
  auto ema = std::dynamic_pointer_cast<EMAWeightAveraging>(trainer_options.callbacks[0]);
  ASSERT_TRUE(ema);
  torch::manual_seed(3);
  TinyNet net;
  auto loader = shuffled_loader(512, 8);  // 64 steps an epoch
  Trainer trainer(trainer_options);
  trainer.fit(net, loader);
  // Updated after every step from step index 100 on.
  ASSERT_TRUE(ema->average_model());
  EXPECT_EQ(ema->average_model()->n_averaged(), 128 - 100);
}

// TinyNet whose batches run out of memory above 48 samples.
struct FortyEightNet : TinyNet {
  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    TORCH_CHECK_WITH(OutOfMemoryError, batch.data.size(0) <= 48, "out of memory");
    return TinyNet::training_step(std::move(batch), batch_idx);
  }
};

TEST(DocsRecipe, BatchSizeFinderThenTheFit) {
  TempDir dir;
  torch::manual_seed(5);
  XY xy(900, 3);
  Data data(xy.x, xy.y);
  FortyEightNet model;
  Trainer trainer(quiet(dir, 2));
  const FitResult result = fit_largest_batches(model, data, trainer);
  // binsearch finds 48, less its 5% margin.
  EXPECT_EQ(data.hparams()["batch_size"].get<int64_t>(), 45);
  EXPECT_EQ(result.global_step, 2 * 20);  // 900 samples in batches of 45
}

}  // namespace
}  // namespace fulgor::testing
