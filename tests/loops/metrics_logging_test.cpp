// log() of a fulgor::metrics::Metric, as Lightning logs a torchmetrics Metric:
// its batch value on_step, its compute() over the epoch on_epoch, then reset.

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

std::vector<double> doubles(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kDouble).contiguous().reshape({-1});
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// Binary accuracy of logits against y > 0, written out.
double accuracy_reference(const std::vector<double>& logits, const std::vector<double>& y) {
  double hits = 0;
  for (size_t i = 0; i < y.size(); ++i) hits += (logits[i] > 0) == (y[i] > 0);
  return hits / y.size();
}

double auroc_reference(const std::vector<double>& scores, const std::vector<double>& y) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < y.size(); ++i)
    for (size_t j = 0; j < y.size(); ++j)
      if (y[i] > 0 && y[j] <= 0) {
        wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
        pairs += 1;
      }
  return wins / pairs;
}

// Classifies y > 0 from the regression net's output; keeps what it saw.
struct Classifier : TinyNet {
  metrics::Accuracy train_accuracy;
  metrics::AUROC val_auroc;
  metrics::MeanAbsoluteError val_mae;
  std::vector<std::vector<double>> train_logits, train_y;  // per batch
  std::vector<double> val_scores, val_y;

  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    const torch::Tensor out = forward(batch.data);
    train_accuracy(out.detach().sigmoid(), (batch.target > 0).to(torch::kLong));
    log("acc", train_accuracy, {.on_step = true, .on_epoch = true});
    train_logits.push_back(doubles(out.detach()));
    train_y.push_back(doubles(batch.target));
    return torch::mse_loss(out, batch.target);
  }
  void validation_step(torch::data::Example<> batch, int64_t) override {
    const torch::Tensor out = forward(batch.data);
    val_auroc.update(out.sigmoid(), (batch.target > 0).to(torch::kLong));
    val_mae.update(out, batch.target);
    log("val_auroc", val_auroc);
    log("val_mae", val_mae);
    for (double v : doubles(out.sigmoid())) val_scores.push_back(v);
    for (double v : doubles(batch.target)) val_y.push_back(v);
  }
};

TEST(MetricLogging, EpochValueIsComputedOverTheWholeEpochThenReset) {
  TempDir dir;
  Classifier model;
  auto val = sequential_loader(30, 8);  // batches of 8, 8, 8 and 6
  const auto result = Trainer(quiet(dir.str())).validate(model, val);
  ASSERT_EQ(model.val_y.size(), 30u);
  // The area over all 30 samples, not a mean of the batches' areas.
  EXPECT_NEAR(result.at("val_auroc"), auroc_reference(model.val_scores, model.val_y), 1e-9);
  double absolute = 0;
  torch::NoGradGuard no_grad;
  const XY data(30, 7);
  const auto predicted = doubles(model.forward(data.x)), y = doubles(data.y);
  for (size_t i = 0; i < y.size(); ++i) absolute += std::abs(predicted[i] - y[i]);
  EXPECT_NEAR(result.at("val_mae"), absolute / 30, 1e-6);
  EXPECT_EQ(model.val_auroc.update_count(), 0) << "reset when the epoch's values were taken";
  EXPECT_EQ(model.val_mae.update_count(), 0);
}

TEST(MetricLogging, StepValuesAreTheBatchsAndEpochValuesTheEpochs) {
  TempDir dir;
  Classifier model;
  auto logger = std::make_shared<RecordingLogger>();
  auto options = quiet(dir, 2);
  options.loggers = {logger};
  options.log_every_n_steps = 1;
  auto train = sequential_loader(20, 8);  // batches of 8, 8 and 4
  Trainer(options).fit(model, train);
  ASSERT_EQ(model.train_y.size(), 6u);
  const auto steps = logger->series("acc_step");
  ASSERT_EQ(steps.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_DOUBLE_EQ(steps[i].second, accuracy_reference(model.train_logits[i], model.train_y[i])) << "batch " << i;
  const auto epochs = logger->series("acc_epoch");
  ASSERT_EQ(epochs.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    std::vector<double> logits, y;
    for (size_t b = 3 * e; b < 3 * e + 3; ++b) {
      logits.insert(logits.end(), model.train_logits[b].begin(), model.train_logits[b].end());
      y.insert(y.end(), model.train_y[b].begin(), model.train_y[b].end());
    }
    // Each epoch's own samples: the metric was reset between the epochs.
    EXPECT_DOUBLE_EQ(epochs[e].second, accuracy_reference(logits, y)) << "epoch " << e;
  }
  EXPECT_EQ(model.train_accuracy.update_count(), 0);
}

TEST(MetricLogging, OnStepNeedsForwardAndOneValue) {
  struct UpdateOnly : TinyNet {
    metrics::Accuracy accuracy;
    torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
      const torch::Tensor out = forward(batch.data);
      accuracy.update(out.detach(), (batch.target > 0).to(torch::kLong));
      log("acc", accuracy);  // on_step by default in training_step
      return torch::mse_loss(out, batch.target);
    }
  };
  TempDir dir;
  UpdateOnly model;
  auto train = sequential_loader(16, 8);
  try {
    Trainer(quiet(dir, 1)).fit(model, train);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("log('acc', metric) on_step needs the batch's value"), std::string::npos)
        << e.what();
  }

  struct Matrix : TinyNet {
    metrics::ConfusionMatrix matrix;
    void validation_step(torch::data::Example<> batch, int64_t) override {
      matrix.update(forward(batch.data).sigmoid(), (batch.target > 0).to(torch::kLong));
      log("cm", matrix);
    }
  };
  Matrix with_matrix;
  auto val = sequential_loader(16, 8);
  try {
    Trainer(quiet(dir.str())).validate(with_matrix, val);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the metric's value has shape [2, 2]; log() takes one value"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fulgor::testing
