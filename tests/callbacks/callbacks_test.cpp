// The built-in callbacks, and what they log.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

TEST(Callbacks, LearningRateMonitorLogsRates) {
  TempDir dir;
  TinyNet model;
  model.make_optimizers = [](TinyNet& m) {
    auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.4));
    return fulgor::OptimizerConfig(sgd, {.scheduler = std::make_shared<StepLR>(*sgd, 1, 0.5)});
  };
  auto train = sequential_loader(8, 4);
  Trainer trainer(quiet(dir, 3, {std::make_shared<LearningRateMonitor>()}));
  trainer.fit(model, train);
  // Logged at the start of the third epoch, after two epoch steps.
  EXPECT_DOUBLE_EQ(trainer.logged_metrics().at("lr-SGD"), 0.1);
}

// SGD at 0.4, halved by a StepLR after every optimizer step.
fulgor::OptimizerConfig halved_every_step(TinyNet& m) {
  auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.4));
  return fulgor::OptimizerConfig(sgd,
                                 {.scheduler = std::make_shared<StepLR>(*sgd, 1, 0.5), .interval = Interval::step});
}

// The (step, rate) pairs a LearningRateMonitor logged over 2 epochs of 3 steps.
std::vector<std::pair<int64_t, double>> monitored_rates(std::optional<Interval> logging_interval,
                                                        int64_t log_every_n_steps = 1) {
  TempDir dir;
  TinyNet model;
  model.make_optimizers = halved_every_step;
  auto train = sequential_loader(12, 4);
  auto logger = std::make_shared<RecordingLogger>();
  auto options = quiet(dir, 2, {std::make_shared<LearningRateMonitor>(logging_interval)});
  options.loggers = {logger};
  options.log_every_n_steps = log_every_n_steps;
  Trainer trainer(options);
  trainer.fit(model, train);
  EXPECT_EQ(trainer.global_step(), 6);
  return logger->series("lr-SGD");
}

TEST(Callbacks, LearningRateMonitorLogsEveryStepTheRateThatStepUses) {
  // Set to steps, and unset with a scheduler that steps per step.
  for (std::optional<Interval> interval : {std::optional<Interval>(Interval::step), std::optional<Interval>()}) {
    SCOPED_TRACE(interval ? "logging_interval=step" : "logging_interval unset");
    const auto rates = monitored_rates(interval);
    ASSERT_EQ(rates.size(), 6u);
    for (size_t i = 0; i < rates.size(); ++i) {
      // Before step i, the scheduler has halved the rate i times.
      EXPECT_EQ(rates[i].first, static_cast<int64_t>(i));
      EXPECT_DOUBLE_EQ(rates[i].second, 0.4 * std::pow(0.5, static_cast<double>(i)));
    }
  }
}

TEST(Callbacks, LearningRateMonitorLogsStepRatesWhenLogsAreDue) {
  const auto rates = monitored_rates(Interval::step, /*log_every_n_steps=*/2);
  ASSERT_EQ(rates.size(), 3u);
  for (size_t k = 0; k < rates.size(); ++k) {
    const int64_t step = 2 * static_cast<int64_t>(k) + 1;  // steps 1, 3, 5: the second of every two
    EXPECT_EQ(rates[k].first, step);
    EXPECT_DOUBLE_EQ(rates[k].second, 0.4 * std::pow(0.5, static_cast<double>(step)));
  }
}

// log_every_n_steps counts optimizer steps: with gradients accumulated over
// two batches, the loggers and the monitor get the values of every second
// step's stepping batch.
TEST(Callbacks, LoggersGetStepValuesEveryLogEveryNStepsOptimizerSteps) {
  TempDir dir;
  TinyNet model;
  model.make_optimizers = halved_every_step;
  auto train = sequential_loader(32, 4);
  std::vector<double> batch_losses;
  auto hooks = std::make_shared<Hooks>();
  hooks->batch_end = [&](Trainer& t, int64_t) { batch_losses.push_back(t.callback_metrics().at("train_loss")); };
  hooks->epoch_end = [](Trainer& t) { t.log_metrics({{"at_epoch_end", 1.0}}); };
  auto logger = std::make_shared<RecordingLogger>();
  auto options = quiet(dir, 1, {hooks, std::make_shared<LearningRateMonitor>(Interval::step)});
  options.loggers = {logger};
  options.log_every_n_steps = 2;
  options.accumulate_grad_batches = 2;
  Trainer trainer(options);
  trainer.fit(model, train);
  ASSERT_EQ(trainer.global_step(), 4);
  ASSERT_EQ(batch_losses.size(), 8u);
  // Batches 3 and 7 take steps 2 and 4, labelled as in Lightning with the
  // steps taken before them.
  const auto losses = logger->series("train_loss");
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_EQ(losses[0], std::make_pair(int64_t{1}, batch_losses[3]));
  EXPECT_EQ(losses[1], std::make_pair(int64_t{3}, batch_losses[7]));
  // The monitor logs as those batches begin: the rates steps 2 and 4 use.
  const auto rates = logger->series("lr-SGD");
  ASSERT_EQ(rates.size(), 2u);
  EXPECT_EQ(rates[0], std::make_pair(int64_t{1}, 0.4 * 0.5));
  EXPECT_EQ(rates[1], std::make_pair(int64_t{3}, 0.4 * 0.125));
  // Values logged at the epoch's end carry the global step.
  EXPECT_EQ(logger->series("at_epoch_end"), (std::vector<std::pair<int64_t, double>>{{4, 1.0}}));
}

TEST(Callbacks, LearningRateMonitorLogsOncePerEpochWhenAskedTo) {
  const auto rates = monitored_rates(Interval::epoch);
  ASSERT_EQ(rates.size(), 2u);
  // At each epoch's start: before step 0, and after the first epoch's 3 steps.
  EXPECT_EQ(rates[0].first, 0);
  EXPECT_DOUBLE_EQ(rates[0].second, 0.4);
  EXPECT_EQ(rates[1].first, 3);
  EXPECT_DOUBLE_EQ(rates[1].second, 0.4 * std::pow(0.5, 3.0));
}

// On the CPU the monitor logs the process's memory under Lightning's keys:
// around the training batches whose logs are due, and around every
// validation and test batch.
TEST(Callbacks, DeviceStatsMonitorLogsTheDevicesMemoryStats) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(16, 4);
  auto val = sequential_loader(8, 4);
  auto logger = std::make_shared<RecordingLogger>();
  auto options = quiet(dir, 1, {std::make_shared<DeviceStatsMonitor>()});
  options.loggers = {logger};
  options.log_every_n_steps = 2;
  Trainer trainer(options);
  trainer.fit(model, train, val);
  trainer.test(model, val);
  const std::string prefix = "DeviceStatsMonitor.";
  // Due at the second and fourth of four steps, labelled with the steps taken before.
  EXPECT_EQ(logger->steps(prefix + "on_train_batch_start/process_resident_bytes"), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(logger->steps(prefix + "on_train_batch_end/process_virtual_bytes"), (std::vector<int64_t>{1, 3}));
  for (const auto& [step, bytes] : logger->series(prefix + "on_train_batch_end/process_resident_bytes"))
    EXPECT_GT(bytes, 1e6) << "step " << step;
  for (const char* hook :
       {"on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end"})
    EXPECT_EQ(logger->series(prefix + hook + "/process_resident_bytes").size(), 2u) << hook;
}

TEST(Callbacks, DeviceStatsMonitorLeavesOutTheCpuWhenToldTo) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(8, 4);
  auto logger = std::make_shared<RecordingLogger>();
  auto options = quiet(dir, 1, {std::make_shared<DeviceStatsMonitor>(/*cpu_stats=*/false)});
  options.loggers = {logger};
  options.log_every_n_steps = 1;
  Trainer(options).fit(model, train);
  for (const auto& [step, metrics] : logger->calls)
    for (const auto& [name, value] : metrics) EXPECT_EQ(name.rfind("DeviceStatsMonitor", 0), std::string::npos) << name;
  EXPECT_FALSE(logger->calls.empty());
}

TEST(Callbacks, DeviceStatsMonitorNeedsALogger) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(8, 4);
  Trainer trainer(quiet(dir, 1, {std::make_shared<DeviceStatsMonitor>()}));
  try {
    trainer.fit(model, train);
    FAIL() << "DeviceStatsMonitor ran without a logger";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DeviceStatsMonitor logs through the Trainer's loggers"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(model.training_steps, 0);
}

TEST(Callbacks, ModelSummaryCountsParameters) {
  TinyNet model;
  const std::string text = summarize(model);
  EXPECT_NE(text.find("l1"), std::string::npos);
  EXPECT_NE(text.find("Linear"), std::string::npos);
  EXPECT_NE(text.find("49        Total params"), std::string::npos) << text;  // 4*8+8 + 8+1
  {
    torch::NoGradGuard g;
    model.l1->weight.set_requires_grad(false);
  }
  EXPECT_NE(summarize(model).find("32        Non-trainable params"), std::string::npos);
}

TEST(Callbacks, TimerStopsCleanly) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(8, 4);
  auto timer = std::make_shared<Timer>(Timer::Duration(0.0));
  auto options = quiet(dir.str());
  options.max_epochs = 100;
  options.callbacks = {timer};
  Trainer trainer(options);
  auto result = trainer.fit(model, train);
  EXPECT_EQ(result.reason, StopReason::requested);
  EXPECT_EQ(model.training_steps, 1);
  EXPECT_NE(result.message.find("Timer"), std::string::npos);
  EXPECT_THROW(Timer("1 hour"), ConfigError);
  EXPECT_DOUBLE_EQ(Timer("00:01:00:00").time_remaining(), 3600.0);
}

// NaN and infinite settings were once taken, and a Timer's day count too
// long for a double ended in std::out_of_range.
TEST(Callbacks, RefuseNanAndInfiniteSettingsNamingThem) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  auto message = [](auto make) {
    try {
      make();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (double value : {nan, inf, -inf}) {
    const std::string shown = fmt::format("{}", value);
    std::string m = message([&] { EarlyStopping({.monitor = "val_loss", .min_delta = value}); });
    EXPECT_NE(m.find("min_delta"), std::string::npos) << m;
    EXPECT_NE(m.find(shown), std::string::npos) << m;
    m = message([&] { EarlyStopping({.monitor = "val_loss", .stopping_threshold = value}); });
    EXPECT_NE(m.find("stopping_threshold"), std::string::npos) << m;
    m = message([&] { EarlyStopping({.monitor = "val_loss", .divergence_threshold = value}); });
    EXPECT_NE(m.find("divergence_threshold"), std::string::npos) << m;
    m = message([&] { ModelCheckpoint({.train_time_interval = std::chrono::duration<double>(value)}); });
    EXPECT_NE(m.find("train_time_interval"), std::string::npos) << m;
    EXPECT_NE(m.find(shown), std::string::npos) << m;
    m = message([&] { Timer{Timer::Duration(value)}; });
    EXPECT_NE(m.find("duration"), std::string::npos) << m;
    EXPECT_NE(m.find(shown), std::string::npos) << m;
    m = message([&] { ProgressBar(nullptr, 10, false, value); });
    EXPECT_NE(m.find("min_line_seconds"), std::string::npos) << m;
    EXPECT_NE(m.find(shown), std::string::npos) << m;
  }
  const std::string days(400, '9');
  EXPECT_NE(message([&] { Timer(days + ":00:00:00"); }).find(days.substr(0, 20)), std::string::npos);
}

// Logs the loss for the progress bar; sleeps first when `pause` is set.
struct ShowLoss : TinyNet {
  std::chrono::milliseconds pause{0};
  torch::Tensor training_step(torch::data::Example<> b, int64_t i) override {
    std::this_thread::sleep_for(pause);
    auto loss = TinyNet::training_step(std::move(b), i);
    log("loss", loss, {.prog_bar = true});
    return loss;
  }
};

// Each plain line's label and count, e.g. "Epoch 1/2 5/10".
std::vector<std::string> line_heads(const std::string& text, int words) {
  std::vector<std::string> heads;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string head, word;
    for (int i = 0; i < words && in >> word; ++i) head += (i ? " " : "") + word;
    heads.push_back(head);
  }
  return heads;
}

TEST(Callbacks, ProgressBarWritesPlainLinesWhenNotATerminal) {
  TempDir dir;
  ShowLoss model;
  auto train = sequential_loader(40, 4);
  auto val = sequential_loader(8, 4);
  std::ostringstream out;
  Trainer trainer(quiet(dir, 2, {std::make_shared<ProgressBar>(&out, 50, false, /*min_line_seconds=*/0.0)}));
  trainer.fit(model, train, val);
  const std::string text = out.str();
  // Every 50% of an epoch, each line once: the epoch's last batch is its final line.
  EXPECT_EQ(line_heads(text, 3),
            (std::vector<std::string>{"Epoch 1/2 5/10", "Epoch 1/2 10/10", "Epoch 2/2 5/10", "Epoch 2/2 10/10"}))
      << text;
  EXPECT_NE(text.find("loss="), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
}

// Lines due every 10% but at least an hour apart: each epoch within the hour
// writes its final line alone.
TEST(Callbacks, ProgressBarSpacesPlainLinesInTime) {
  TempDir dir;
  ShowLoss model;
  auto train = sequential_loader(40, 4);
  std::ostringstream out;
  Trainer trainer(quiet(dir, 2, {std::make_shared<ProgressBar>(&out, 10, false, /*min_line_seconds=*/3600.0)}));
  trainer.fit(model, train);
  EXPECT_EQ(line_heads(out.str(), 3), (std::vector<std::string>{"Epoch 1/2 10/10", "Epoch 2/2 10/10"})) << out.str();
}

// Lines due every 10% but 0.1 s apart, batches of 20 ms: between lines the
// bar looks at the clock only near the time one is due (Note [Looking at the
// clock] in src/callbacks/progress_bar.cpp), and still writes them as time passes.
TEST(Callbacks, ProgressBarWritesPlainLinesAsTheirTimeComes) {
  TempDir dir;
  ShowLoss model;
  model.pause = std::chrono::milliseconds(20);
  auto train = sequential_loader(160, 4);  // 40 batches, 0.8 s or more
  std::ostringstream out;
  Trainer trainer(quiet(dir, 1, {std::make_shared<ProgressBar>(&out, 10, false, /*min_line_seconds=*/0.1)}));
  trainer.fit(model, train);
  const auto heads = line_heads(out.str(), 3);
  ASSERT_FALSE(heads.empty());
  EXPECT_EQ(heads.back(), "Epoch 1/1 40/40");
  EXPECT_GE(heads.size(), 4u) << out.str();
}

// A resumed epoch's rate counts only its own batches: 20 batches of 20 ms
// or more after 200 restored ones run at 50 batches a second at most, and
// their first line comes once 0.3 s have passed, before the epoch's end (a
// loaded machine, slower, may write more than one).
TEST(Callbacks, ProgressBarRateOfAResumedEpochCountsItsOwnBatches) {
  TempDir dir;
  const std::string path = (dir.path / "mid.ckpt").string();
  auto train = sequential_loader(880, 4);  // 220 batches
  {
    ShowLoss model;
    auto save = std::make_shared<Hooks>();  // in the epoch's middle
    save->batch_end = [&](Trainer& t, int64_t) {
      if (t.global_step() == 200) t.save_checkpoint(path);
    };
    auto options = quiet(dir, 1, {save});
    options.max_steps = 200;
    Trainer trainer(options);
    trainer.fit(model, train);
  }
  ShowLoss model;
  model.pause = std::chrono::milliseconds(20);
  std::ostringstream out;
  Trainer trainer(quiet(dir, 1, {std::make_shared<ProgressBar>(&out, 5, false, /*min_line_seconds=*/0.3)}));
  trainer.fit(model, train, {.ckpt_path = path});
  const std::regex line(R"(Epoch 1/1 (\d+)/220 (\d+\.\d)it/s .*)");
  std::vector<int> counts;
  std::istringstream lines(out.str());
  for (std::string one; std::getline(lines, one);) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(one, m, line)) << one;
    counts.push_back(std::stoi(m[1]));
    EXPECT_LE(std::stod(m[2]), 50.5) << one;
  }
  ASSERT_GE(counts.size(), 2u) << out.str();
  EXPECT_GT(counts[0], 200);
  EXPECT_TRUE(std::is_sorted(counts.begin(), counts.end()) &&
              std::adjacent_find(counts.begin(), counts.end()) == counts.end())
      << out.str();
  EXPECT_EQ(counts.back(), 220);
}

TEST(Callbacks, ProgressBarWritesALineOnceWhenTheEpochStopsRightAfterIt) {
  TempDir dir;
  ShowLoss model;
  auto train = sequential_loader(40, 4);
  std::ostringstream out;
  auto options = quiet(dir.str());
  options.max_steps = 5;  // half of the epoch, where a line is due
  options.callbacks = {std::make_shared<ProgressBar>(&out, 50, false, /*min_line_seconds=*/0.0)};
  Trainer trainer(options);
  trainer.fit(model, train);
  EXPECT_EQ(line_heads(out.str(), 3), std::vector<std::string>{"Epoch 1 5/10"}) << out.str();
}

TEST(Callbacks, ProgressBarRedrawsOneLineOnATerminal) {
  TempDir dir;
  ShowLoss model;
  // Longer than the bar waits between redraws, so that every batch draws.
  model.pause = std::chrono::milliseconds(110);
  auto train = sequential_loader(12, 4);
  std::ostringstream out;
  Trainer trainer(quiet(dir, 2, {std::make_shared<ProgressBar>(&out, 10, /*terminal=*/true)}));
  trainer.fit(model, train);
  const std::string text = out.str();
  // One line per epoch, each drawn over itself after a carriage return.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  ASSERT_EQ(text.rfind('\r', 0), 0u) << text;
  const std::regex draw(
      R"(\x1b\[K(Epoch \d+/2) \[[= ]+\] (\d+)/3 (\d+\.\d)it/s ETA (\d\d:\d\d) elapsed \d\d:\d\d loss=\S+(\n?))");
  std::vector<std::string> drawn;
  std::istringstream draws(text.substr(1));
  for (std::string one; std::getline(draws, one, '\r');) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(one, m, draw)) << "unexpected draw: " << one;
    EXPECT_GT(std::stod(m[3]), 0.0) << one;
    // Only an epoch's final draw ends its line.
    EXPECT_EQ(m[5].length() == 1, m[2] == "3") << one;
    drawn.push_back(m[1].str() + " " + m[2].str());
  }
  EXPECT_EQ(drawn, (std::vector<std::string>{"Epoch 1/2 1", "Epoch 1/2 2", "Epoch 1/2 3", "Epoch 2/2 1", "Epoch 2/2 2",
                                             "Epoch 2/2 3"}));
}

}  // namespace
}  // namespace fulgor::testing
