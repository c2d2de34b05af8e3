// What the Trainer's metric tables and loggers hold, written from Lightning
// 2.6's logger connector (trainer/connectors/logger_connector/).

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

// A validation_step logging a value on every step and for the epoch.
struct StepAndEpoch : TinyNet {
  void validation_step(torch::data::Example<> batch, int64_t) override {
    log("v", torch::mse_loss(forward(batch.data), batch.target), {.on_step = true, .on_epoch = true});
  }
};

// _ResultCollection.metrics: "callback metrics don't take `_step` forked
// metrics" of an evaluation loop, and take its values only once its epoch
// ends; a training step's values stay.
TEST(Logging, CallbackMetricsTakeNoEvaluationStepValues) {
  struct Look : fulgor::Callback {
    std::vector<std::map<std::string, double>> during, after;
    void on_validation_batch_end(Trainer& t, ModuleBase&, int64_t) override {
      if (!t.sanity_checking()) during.push_back(t.callback_metrics());
    }
    void on_validation_end(Trainer& t, ModuleBase&) override {
      if (!t.sanity_checking()) after.push_back(t.callback_metrics());
    }
  };
  TempDir dir;
  StepAndEpoch model;
  auto look = std::make_shared<Look>();
  auto train = sequential_loader(64, 8);
  auto val = sequential_loader(32, 8);
  Trainer(quiet(dir, 1, {look})).fit(model, train, val);
  ASSERT_EQ(look->during.size(), 4u);
  for (const auto& metrics : look->during) {
    EXPECT_EQ(metrics.count("v_step"), 0u);
    EXPECT_EQ(metrics.count("v"), 0u);
    EXPECT_EQ(metrics.count("train_loss"), 1u);
  }
  ASSERT_EQ(look->after.size(), 1u);
  EXPECT_EQ(look->after[0].count("v_step"), 0u);
  EXPECT_EQ(look->after[0].count("v_epoch"), 1u);
  EXPECT_EQ(look->after[0].count("v"), 1u);
  EXPECT_EQ(look->after[0].count("train_loss"), 1u);
}

// The logger connector's on_batch_end updates logged_metrics at every batch,
// with or without a logger, whether or not the loggers are due to get them.
TEST(Logging, LoggedMetricsFollowEveryBatchWithoutALogger) {
  struct Look : fulgor::Callback {
    std::vector<std::optional<double>> seen;
    void on_train_batch_end(Trainer& t, ModuleBase&, const torch::Tensor& loss, int64_t) override {
      auto it = t.logged_metrics().find("train_loss");
      seen.push_back(it == t.logged_metrics().end() ? std::nullopt : std::optional<double>(it->second));
      expected.push_back(loss.item<double>());
    }
    std::vector<double> expected;
  };
  TempDir dir;
  TinyNet model;
  auto look = std::make_shared<Look>();
  auto options = quiet(dir, 1, {look});  // no logger; log_every_n_steps=50
  auto train = sequential_loader(24, 8);
  Trainer(options).fit(model, train);
  ASSERT_EQ(look->seen.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(look->seen[i].has_value()) << "batch " << i;
    EXPECT_FLOAT_EQ(*look->seen[i], look->expected[i]);
  }
}

// FitLoop.on_advance_end logs a training epoch's values with
// _batches_that_stepped - 1: the label of the epoch's last step.
struct EpochValues : TinyNet {
  torch::Tensor training_step(torch::data::Example<> batch, int64_t i) override {
    auto loss = TinyNet::training_step(std::move(batch), i);
    log("e", loss, {.on_step = false, .on_epoch = true});
    return loss;
  }
  void on_train_epoch_end() override { log("end", 1.0); }
};

std::vector<int64_t> epoch_steps(int64_t accumulate, const std::string& metric) {
  TempDir dir;
  EpochValues model;
  auto logger = std::make_shared<RecordingLogger>();
  auto options = quiet(dir, 2);
  options.loggers = {logger};
  options.accumulate_grad_batches = accumulate;
  auto train = sequential_loader(64, 8);
  Trainer(options).fit(model, train);
  return logger->steps(metric);
}

TEST(Logging, TrainingEpochValuesCarryTheEpochsLastStep) {
  EXPECT_EQ(epoch_steps(1, "e"), (std::vector<int64_t>{7, 15}));
  EXPECT_EQ(epoch_steps(2, "e"), (std::vector<int64_t>{3, 7}));
  // Values logged in on_train_epoch_end join the epoch's.
  EXPECT_EQ(epoch_steps(1, "end"), (std::vector<int64_t>{7, 15}));
}

// _run_sanity_check: the sanity check's values reach no logger, and the
// metrics are reset after it, though its callbacks see them.
TEST(Logging, SanityCheckValuesAreSeenByCallbacksThenForgotten) {
  struct Look : fulgor::Callback {
    bool saw_in_sanity = false;
    std::map<std::string, double> at_train_start;
    void on_validation_end(Trainer& t, ModuleBase&) override {
      if (t.sanity_checking()) saw_in_sanity = t.callback_metrics().count("val_loss") > 0;
    }
    void on_train_start(Trainer& t, ModuleBase&) override { at_train_start = t.callback_metrics(); }
  };
  TempDir dir;
  TinyNet model;
  auto look = std::make_shared<Look>();
  auto logger = std::make_shared<RecordingLogger>();
  auto options = quiet(dir, 1, {look});
  options.loggers = {logger};
  options.num_sanity_val_steps = 2;
  auto train = sequential_loader(64, 8);
  auto val = sequential_loader(32, 8);
  Trainer(options).fit(model, train, val);
  EXPECT_TRUE(look->saw_in_sanity);
  EXPECT_TRUE(look->at_train_start.empty());
  EXPECT_EQ(logger->steps("val_loss").size(), 1u);  // the epoch's validation only
}

}  // namespace
}  // namespace fulgor::testing
