// Throughput and ThroughputMonitor, as Lightning's (fabric's Throughput and
// its callback), on an injected clock.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

using Metrics = std::map<std::string, double>;

TEST(Throughput, RatesOverTheWindowAndTotalsOverTheJob) {
  const int64_t world = 2;
  Throughput throughput(/*available_flops=*/50.0, world, /*window_size=*/3);
  const std::vector<double> times{0.5, 1.25, 2.0, 3.5};
  const std::vector<int64_t> samples{4, 8, 12, 15};
  const std::vector<int64_t> lengths{40, 80, 120, 150};
  const std::vector<double> flops{10, 20, 30, 40};
  for (size_t k = 0; k < 2; ++k) throughput.update(times[k], k + 1, samples[k], lengths[k], flops[k]);
  // The window is not full: totals only.
  EXPECT_EQ(throughput.compute(), (Metrics{{"time", 1.25}, {"batches", 2}, {"samples", 8}, {"lengths", 80}}));
  for (size_t k = 2; k < 4; ++k) throughput.update(times[k], k + 1, samples[k], lengths[k], flops[k]);
  const Metrics m = throughput.compute();
  // The window holds updates 1 to 3.
  const double elapsed = times[3] - times[1];
  EXPECT_DOUBLE_EQ(m.at("device/batches_per_sec"), 2 / elapsed);
  EXPECT_DOUBLE_EQ(m.at("device/samples_per_sec"), (samples[3] - samples[1]) / elapsed);
  EXPECT_DOUBLE_EQ(m.at("device/items_per_sec"), (lengths[3] - lengths[1]) / elapsed);
  EXPECT_DOUBLE_EQ(m.at("batches_per_sec"), 2 / elapsed * world);
  EXPECT_DOUBLE_EQ(m.at("samples_per_sec"), (samples[3] - samples[1]) / elapsed * world);
  EXPECT_DOUBLE_EQ(m.at("items_per_sec"), (lengths[3] - lengths[1]) / elapsed * world);
  // Lightning's sum of the window's FLOPs (over the ranks) but its first.
  const double job_flops = (flops[2] + flops[3]) * world;
  EXPECT_DOUBLE_EQ(m.at("flops_per_sec"), job_flops / elapsed);
  EXPECT_DOUBLE_EQ(m.at("device/flops_per_sec"), job_flops / elapsed / world);
  EXPECT_DOUBLE_EQ(m.at("device/mfu"), job_flops / elapsed / world / 50.0);
  EXPECT_EQ(m.size(), 13u);
}

TEST(Throughput, RefusesWhatLightningRefuses) {
  Throughput throughput;
  throughput.update(1.0, 1, 4);
  EXPECT_THROW(throughput.update(1.0, 2, 8), Error);  // time did not increase
  try {
    Throughput().update(1.0, 3, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Expected samples (2) to be greater or equal than batches (3)");
  }
  EXPECT_THROW(Throughput().update(1.0, 1, 4, 3), Error);
  EXPECT_THROW(Throughput(std::nullopt, 1, 1), ConfigError);
  EXPECT_THROW(Throughput(std::nullopt, 0), ConfigError);
}

// A clock that advances `dt` at every reading.
struct StepClock {
  double now = 0, dt = 0.25;
  std::function<double()> fn() {
    return [this] { return now += dt; };
  }
};

ThroughputMonitorOptions monitor_options(StepClock& clock) {
  ThroughputMonitorOptions o;
  o.batch_size_fn = [](const BatchEnd& end) { return end.batch<torch::data::Example<>>().data.size(0); };
  o.length_fn = [](const BatchEnd& end) { return 3 * end.batch<torch::data::Example<>>().data.size(0); };
  o.flops_per_batch = [](const ModuleBase&) { return 1000.0; };
  o.available_flops = 1e4;
  o.window_size = 2;
  o.clock = clock.fn();
  return o;
}

std::vector<double> values(const RecordingLogger& logger, const std::string& name) {
  std::vector<double> out;
  for (const auto& [step, value] : logger.series(name)) out.push_back(value);
  return out;
}

TEST(ThroughputMonitor, LogsLightningsNamesForTraining) {
  TempDir dir;
  StepClock clock;
  auto logger = std::make_shared<RecordingLogger>();
  auto o = quiet(dir, 1, {std::make_shared<ThroughputMonitor>(monitor_options(clock))});
  o.logger = true;
  o.loggers = {logger};
  o.log_every_n_steps = 1;
  TinyNet model;
  Trainer trainer(o);
  auto train = sequential_loader(12, 4);
  trainer.fit(model, train);
  const double dt = clock.dt;
  // One reading as training starts, one per batch.
  EXPECT_EQ(values(*logger, "train/time"), (std::vector<double>{dt, 2 * dt, 3 * dt}));
  EXPECT_EQ(values(*logger, "train/batches"), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(values(*logger, "train/samples"), (std::vector<double>{4, 8, 12}));
  EXPECT_EQ(values(*logger, "train/lengths"), (std::vector<double>{12, 24, 36}));
  // The rates once the window of two updates is full.
  EXPECT_EQ(values(*logger, "train/device/batches_per_sec"), (std::vector<double>{1 / dt, 1 / dt}));
  EXPECT_EQ(values(*logger, "train/device/samples_per_sec"), (std::vector<double>{4 / dt, 4 / dt}));
  EXPECT_EQ(values(*logger, "train/device/items_per_sec"), (std::vector<double>{12 / dt, 12 / dt}));
  EXPECT_EQ(values(*logger, "train/device/flops_per_sec"), (std::vector<double>{1000 / dt, 1000 / dt}));
  EXPECT_EQ(values(*logger, "train/device/mfu"), (std::vector<double>{1000 / dt / 1e4, 1000 / dt / 1e4}));
  // One device: no totals over the job.
  EXPECT_TRUE(logger->series("train/samples_per_sec").empty());
}

TEST(ThroughputMonitor, TrainingTimeLeavesOutValidationAndValidationStartsAgain) {
  TempDir dir;
  StepClock clock;
  auto logger = std::make_shared<RecordingLogger>();
  auto o = quiet(dir, 2, {std::make_shared<ThroughputMonitor>(monitor_options(clock))});
  o.logger = true;
  o.loggers = {logger};
  o.log_every_n_steps = 1;
  TinyNet model;
  Trainer trainer(o);
  auto train = sequential_loader(12, 4);
  auto val = sequential_loader(4, 2);
  trainer.fit(model, train, val);
  const double dt = clock.dt;
  std::vector<double> expected;
  for (int k = 1; k <= 6; ++k) expected.push_back(k * dt);
  EXPECT_EQ(values(*logger, "train/time"), expected);
  EXPECT_EQ(values(*logger, "validate/batches"), (std::vector<double>{1, 2, 1, 2}));
  EXPECT_EQ(values(*logger, "validate/time"), (std::vector<double>{dt, 2 * dt, dt, 2 * dt}));
}

TEST(ThroughputMonitor, EvaluationLoopsCountOverCallsAndLogEveryNSteps) {
  TempDir dir;
  StepClock clock;
  auto logger = std::make_shared<RecordingLogger>();
  auto o = quiet(dir, 1, {std::make_shared<ThroughputMonitor>(monitor_options(clock))});
  o.logger = true;
  o.loggers = {logger};
  o.log_every_n_steps = 2;
  TinyNet model;
  Trainer trainer(o);
  auto loader = sequential_loader(12, 4);
  trainer.predict(model, loader);
  trainer.predict(model, loader);
  trainer.test(model, loader);
  // Batches 2 of each call (the second of three), counted on from the first call.
  EXPECT_EQ(values(*logger, "predict/batches"), (std::vector<double>{2, 5}));
  EXPECT_EQ(values(*logger, "predict/samples"), (std::vector<double>{8, 20}));
  EXPECT_EQ(values(*logger, "test/batches"), (std::vector<double>{2}));
}

TEST(ThroughputMonitor, NeedsABatchSizeFunction) {
  EXPECT_THROW(ThroughputMonitor({}), ConfigError);
  StepClock clock;
  auto o = monitor_options(clock);
  o.window_size = 1;
  EXPECT_THROW(ThroughputMonitor{o}, ConfigError);
}

}  // namespace
}  // namespace fulgor::testing
