// SpikeDetection, as Lightning's.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <vector>

#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

// Training losses with the values given, one per step.
struct ScriptedLoss : TinyNet {
  std::vector<double> losses;
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    const double value = losses[static_cast<size_t>(trainer().global_step())];
    return forward(batch.data).sum() * 0 + value;
  }
};

const double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(SpikeDetection, ThrowsAtASpikeAndWritesTheBatchesToSkip) {
  TempDir dir;
  auto train = sequential_loader(32, 4);
  ScriptedLoss model;
  // A rise of 0.05 is no spike (rtol 2 of a mean of 0.9); 5.0 is.
  model.losses = {1.0, 0.9, 0.8, 0.85, 0.7, 5.0, 0.6, 0.5};
  auto spikes = std::make_shared<SpikeDetection>();
  Trainer trainer(quiet(dir, 1, {spikes}));
  try {
    trainer.fit(model, train);
    ADD_FAILURE() << "no spike found";
  } catch (const TrainingSpikeException& e) {
    EXPECT_EQ(e.batch_idx(), 5);
    EXPECT_STREQ(e.what(), "Training spike detected in batch 5");
  }
  EXPECT_EQ(spikes->bad_batches(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(spikes->exclude_batches_path(), (dir.path / "skip_batches.json").string());
  std::ifstream file(dir.path / "skip_batches.json");
  EXPECT_EQ(nlohmann::json::parse(file), nlohmann::json({4, 5}));
}

TEST(SpikeDetection, NonFiniteLossesWarmupAndTolerances) {
  TempDir dir;
  auto train = sequential_loader(16, 4);
  auto run = [&](std::vector<double> losses, SpikeDetectionOptions options) {
    options.exclude_batches_path = dir.str();
    ScriptedLoss model;
    model.losses = std::move(losses);
    Trainer trainer(quiet(dir, 1, {std::make_shared<SpikeDetection>(options)}));
    try {
      trainer.fit(model, train);
      return int64_t{-1};
    } catch (const TrainingSpikeException& e) {
      return e.batch_idx();
    }
  };
  EXPECT_EQ(run({1.0, 0.9, kNaN, 0.8}, {}), 2);
  // Not finite_only: a NaN is skipped, neither a spike nor in the mean.
  EXPECT_EQ(run({1.0, 0.9, kNaN, 0.8}, {.finite_only = false}), -1);
  // Within the warmup a jump is not looked at.
  EXPECT_EQ(run({1.0, 9.0, 9.5, 9.6}, {.warmup = 2}), -1);
  EXPECT_EQ(run({1.0, 9.0, 9.5, 9.6}, {}), 1);
  // atol and rtol must both be exceeded.
  EXPECT_EQ(run({1.0, 3.5, 1.0, 1.0}, {.atol = 3.0}), -1);
  EXPECT_EQ(run({1.0, 3.5, 1.0, 1.0}, {.atol = 2.0}), 1);
  // mode "max": a fall is the spike.
  EXPECT_EQ(run({10.0, 11.0, 1.0, 12.0}, {.mode = "max", .rtol = 0.5}), 2);
}

TEST(SpikeDetection, StateRoundTripsAndBadOptionsAreRefused) {
  SpikeDetection a({.window = 3, .atol = 0.5});
  const nlohmann::json state = {{"last_val", 0.7},
                                {"mode", "max"},
                                {"warmup", 4},
                                {"atol", nullptr},
                                {"rtol", 1.5},
                                {"bad_batches", {2, 3}},
                                {"bad_batches_path", "/x/skip_batches.json"},
                                {"running", {1.0, 0.9, 0.8, 0.7}}};
  a.load_state_dict(state);
  auto back = a.state_dict();
  EXPECT_EQ(back["running"], nlohmann::json({0.9, 0.8, 0.7}));  // the window's last 3
  back["running"] = state["running"];
  EXPECT_EQ(back, state);
  EXPECT_THROW(SpikeDetection({.mode = "lowest"}), ConfigError);
  EXPECT_THROW(SpikeDetection({.window = 0}), ConfigError);
}

}  // namespace
}  // namespace fulgor::testing
