// EarlyStopping's decisions, each written from Lightning 2.6's
// callbacks/early_stopping.py.

#include <cmath>
#include <limits>
#include <set>

#include "tiny.h"

namespace fulgor::testing {
namespace {

// The set-up of the reports: 64 training and 32 validation samples in batches
// of 8, SGD 0.1; validation logs `val_loss` from the model's script, one value
// per validation run.
struct Run {
  TempDir dir;
  TinyNet model;
  std::shared_ptr<EarlyStopping> stopper;
  TrainerOptions options;

  Run(std::vector<double> val_losses, EarlyStoppingOptions stopping, int64_t epochs) {
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
  Run run({1.0, 0.9, 0.95, 0.97}, {.monitor = "val_loss", .patience = 2}, 10);
  run.options.check_val_every_n_epoch = 2;
  const auto result = run.fit();
  // Validation after epochs 1, 3, 5, 7: 1.0, 0.9, then two without improvement.
  EXPECT_EQ(run.model.validation_runs, 4);
  EXPECT_EQ(result.reason, StopReason::requested);
  EXPECT_EQ(run.stopper->stopped_epoch(), 7);
  EXPECT_EQ(run.stopper->wait_count(), 2);
  EXPECT_DOUBLE_EQ(run.stopper->best_score(), 0.9);
}

}  // namespace
}  // namespace fulgor::testing
