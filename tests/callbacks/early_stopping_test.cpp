// EarlyStopping's decisions, each written from Lightning 2.6's
// callbacks/early_stopping.py.

#include <cmath>
#include <limits>
#include <set>

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

// The set-up of the reports: 64 training and 32 validation samples in batches
// of 8, SGD 0.1; validation logs `val_loss` from the model's script, one value
// per validation run.
struct StoppingScenario {
  TempDir dir;
  TinyNet model;
  std::shared_ptr<EarlyStopping> stopper;
  TrainerOptions options;

  StoppingScenario(std::vector<double> val_losses, EarlyStoppingOptions stopping, int64_t epochs) {
    model.scripted_val = std::move(val_losses);
    stopper = std::make_shared<EarlyStopping>(stopping);
    options = quiet(dir, epochs, {stopper});
  }
  FitResult fit() {
    auto train = sequential_loader(64, 8);
    auto val = sequential_loader(32, 8, 8);
    Trainer trainer(options);
    return trainer.fit(model, train, val);
  }
};

// With check_val_every_n_epoch=2 the check follows validation (Lightning's
// setup: check_on_train_epoch_end is false unless both intervals are 1), so
// an epoch without validation is not checked and the missing metric is no
// error.
TEST(EarlyStopping, EpochsWithoutValidationAreNotChecked) {
  StoppingScenario run({1.0, 0.9, 0.95, 0.97}, {.monitor = "val_loss", .patience = 2}, 10);
  run.options.check_val_every_n_epoch = 2;
  const auto result = run.fit();
  // Validation after epochs 1, 3, 5, 7: 1.0, 0.9, then two without improvement.
  EXPECT_EQ(run.model.validation_runs, 4);
  EXPECT_EQ(result.reason, StopReason::requested);
  EXPECT_EQ(run.stopper->stopped_epoch(), 7);
  EXPECT_EQ(run.stopper->wait_count(), 2);
  EXPECT_DOUBLE_EQ(run.stopper->best_score(), 0.9);
}

// _evaluate_stopping_criteria's reasons and messages.
TEST(EarlyStopping, StopsWithLightningsReasonAndMessage) {
  StoppingScenario patience({1.0, 0.8, 0.85, 0.9}, {.monitor = "val_loss", .patience = 2}, 10);
  const auto result = patience.fit();
  EXPECT_EQ(patience.stopper->stopping_reason(), EarlyStoppingReason::patience_exhausted);
  EXPECT_EQ(patience.stopper->stopping_reason_message(),
            "Monitored metric val_loss did not improve in the last 2 records. Best score: 0.800. Signaling Trainer "
            "to stop.");
  EXPECT_EQ(result.message, patience.stopper->stopping_reason_message());

  StoppingScenario threshold({1.0, 0.05}, {.monitor = "val_loss", .stopping_threshold = 0.1}, 10);
  threshold.fit();
  EXPECT_EQ(threshold.stopper->stopping_reason(), EarlyStoppingReason::stopping_threshold);
  EXPECT_EQ(threshold.stopper->stopping_reason_message(),
            "Stopping threshold reached: val_loss = 0.05 < 0.1. Signaling Trainer to stop.");

  StoppingScenario divergence({1.0, 6.0}, {.monitor = "val_loss", .divergence_threshold = 5.0}, 10);
  divergence.fit();
  EXPECT_EQ(divergence.stopper->stopping_reason(), EarlyStoppingReason::divergence_threshold);
  EXPECT_EQ(divergence.stopper->stopping_reason_message(),
            "Divergence threshold reached: val_loss = 6.0 < 5.0. Signaling Trainer to stop.");
  EXPECT_EQ(divergence.stopper->stopped_epoch(), 1);

  StoppingScenario nan({1.0, std::nan("")}, {.monitor = "val_loss"}, 10);
  nan.fit();
  EXPECT_EQ(nan.stopper->stopping_reason(), EarlyStoppingReason::non_finite_metric);
  EXPECT_EQ(nan.stopper->stopping_reason_message(),
            "Monitored metric val_loss = nan is not finite. Previous best value was 1.000. Signaling Trainer to stop.");

  StoppingScenario running({1.0, 0.9}, {.monitor = "val_loss"}, 2);
  running.fit();
  EXPECT_EQ(running.stopper->stopping_reason(), EarlyStoppingReason::not_stopped);
  EXPECT_EQ(running.stopper->stopping_reason_message(), "");
}

// Lightning multiplies min_delta by the mode's sign without taking its
// absolute value: a negative min_delta in "min" mode lets a slightly worse
// value count as an improvement.
TEST(EarlyStopping, MinDeltaKeepsItsSign) {
  StoppingScenario run({1.0, 1.05, 1.08, 1.2}, {.monitor = "val_loss", .min_delta = -0.1, .patience = 1}, 10);
  run.fit();
  // 1.05 - 0.1 < 1.0 and 1.08 - 0.1 < 1.05 improve; 1.2 - 0.1 > 1.08 does not.
  EXPECT_EQ(run.stopper->stopped_epoch(), 3);
  EXPECT_DOUBLE_EQ(run.stopper->best_score(), 1.08);

  StoppingScenario positive({1.0, 0.95, 0.9}, {.monitor = "val_loss", .min_delta = 0.1, .patience = 1}, 10);
  positive.fit();
  EXPECT_EQ(positive.stopper->stopped_epoch(), 1);
  EXPECT_DOUBLE_EQ(positive.stopper->best_score(), 1.0);
}

// check_on_train_epoch_end: unset, Lightning checks after validation when
// there are several validation runs per epoch; true checks once per epoch.
TEST(EarlyStopping, CheckOnTrainEpochEndDecidesWhenItChecks) {
  StoppingScenario after_each({1.0, 1.1, 1.2, 1.3}, {.monitor = "val_loss", .patience = 2}, 10);
  after_each.options.val_check_interval = 0.5;
  after_each.fit();
  // Checked after each of the two runs per epoch: stops at epoch 1's first.
  EXPECT_EQ(after_each.model.validation_runs, 3);
  EXPECT_EQ(after_each.stopper->stopped_epoch(), 1);

  StoppingScenario per_epoch({1.0, 1.1, 1.2, 1.3, 1.4, 1.5},
                     {.monitor = "val_loss", .patience = 2, .check_on_train_epoch_end = true}, 10);
  per_epoch.options.val_check_interval = 0.5;
  per_epoch.fit();
  // Checked at the epochs' ends only, with their second runs' values (1.1, 1.3, 1.5).
  EXPECT_EQ(per_epoch.model.validation_runs, 6);
  EXPECT_EQ(per_epoch.stopper->stopped_epoch(), 2);
  EXPECT_DOUBLE_EQ(per_epoch.stopper->best_score(), 1.1);
}

// Lightning's setup resolves an unset check_on_train_epoch_end to
// `trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1`.
TEST(EarlyStopping, SetupResolvesCheckOnTrainEpochEnd) {
  StoppingScenario defaults({1.0}, {.monitor = "val_loss"}, 1);
  EXPECT_EQ(defaults.stopper->check_on_train_epoch_end(), std::nullopt);
  defaults.fit();
  EXPECT_EQ(defaults.stopper->check_on_train_epoch_end(), true);

  StoppingScenario half_epochs({1.0}, {.monitor = "val_loss"}, 1);
  half_epochs.options.val_check_interval = 0.5;
  half_epochs.fit();
  EXPECT_EQ(half_epochs.stopper->check_on_train_epoch_end(), false);

  // An interval of 1 batch equals 1.0 in Python's comparison, as here.
  StoppingScenario every_batch({1.0}, {.monitor = "val_loss"}, 1);
  every_batch.options.val_check_interval = 1;
  every_batch.fit();
  EXPECT_EQ(every_batch.stopper->check_on_train_epoch_end(), true);

  StoppingScenario every_other_epoch({1.0}, {.monitor = "val_loss"}, 2);
  every_other_epoch.options.check_val_every_n_epoch = 2;
  every_other_epoch.fit();
  EXPECT_EQ(every_other_epoch.stopper->check_on_train_epoch_end(), false);

  // A value given is kept, whatever the intervals.
  StoppingScenario given({1.0}, {.monitor = "val_loss", .check_on_train_epoch_end = false}, 1);
  EXPECT_EQ(given.stopper->check_on_train_epoch_end(), false);
  given.fit();
  EXPECT_EQ(given.stopper->check_on_train_epoch_end(), false);
}

// _validate_condition_metric: a missing metric is an error naming the logged
// ones when strict, else the check is skipped.
TEST(EarlyStopping, AMissingMetricFailsOnlyWhenStrict) {
  StoppingScenario strict({1.0}, {.monitor = "val_acc"}, 2);
  try {
    strict.fit();
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "Early stopping conditioned on metric `val_acc` which is not available. Pass in or modify your "
              "`EarlyStopping` callback to use any of the following: `train_loss`, `val_loss`");
  }
  StoppingScenario lenient({1.0}, {.monitor = "val_acc", .strict = false}, 2);
  EXPECT_EQ(lenient.fit().reason, StopReason::max_epochs);
  EXPECT_EQ(lenient.stopper->wait_count(), 0);
}

// Lightning's state_dict keys, and a stop's reason survives a reload.
TEST(EarlyStopping, StateDictHasLightningsKeys) {
  StoppingScenario run({1.0, 2.0}, {.monitor = "val_loss", .patience = 1}, 10);
  run.fit();
  const auto state = run.stopper->state_dict();
  std::set<std::string> keys;
  for (const auto& item : state.items()) keys.insert(item.key());
  EXPECT_EQ(keys, (std::set<std::string>{"wait_count", "stopped_epoch", "best_score", "patience", "stopping_reason",
                                         "stopping_reason_message"}));
  EarlyStopping reloaded({.monitor = "val_loss", .patience = 7});
  reloaded.load_state_dict(state);
  EXPECT_EQ(reloaded.stopping_reason(), EarlyStoppingReason::patience_exhausted);
  EXPECT_EQ(reloaded.stopping_reason_message(), run.stopper->stopping_reason_message());
  EXPECT_EQ(reloaded.wait_count(), 1);
  EXPECT_EQ(reloaded.stopped_epoch(), 1);
  EXPECT_DOUBLE_EQ(reloaded.best_score(), 1.0);
  EXPECT_EQ(reloaded.state_dict().at("patience"), 1);
}

}  // namespace
}  // namespace fulgor::testing
