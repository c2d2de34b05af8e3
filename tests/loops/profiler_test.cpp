// profiler = "simple": what the loops record, and Lightning's report.

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

constexpr auto kNap = std::chrono::milliseconds(20);

struct Sleepy : TinyNet {
  torch::Tensor training_step(torch::data::Example<> batch, int64_t i) override {
    std::this_thread::sleep_for(kNap);
    return TinyNet::training_step(std::move(batch), i);
  }
};

SimpleProfiler::Action recorded(const Trainer& trainer, const std::string& name) {
  const SimpleProfiler::Action* a = trainer.profiler()->find(name);
  if (!a) ADD_FAILURE() << "no action '" << name << "' in\n" << trainer.profiler()->summary("fit");
  return a ? *a : SimpleProfiler::Action();
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(Profiler, TimesTheTrainingStepAndEachHook) {
  TempDir dir;
  auto counter = std::make_shared<Hooks>();
  auto options = quiet(dir, 2, {counter});
  options.profiler = "simple";
  Sleepy model;
  auto train = sequential_loader(40, 8);  // 5 batches
  Trainer trainer(options);
  ::testing::internal::CaptureStdout();
  const auto started = std::chrono::steady_clock::now();
  trainer.fit(model, train);
  const double fit_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ::testing::internal::GetCapturedStdout();
  ASSERT_NE(trainer.profiler(), nullptr);

  const auto step = recorded(trainer, "[Strategy]SingleDeviceStrategy.training_step");
  EXPECT_EQ(step.calls, 10);
  const double nap = std::chrono::duration<double>(kNap).count();
  EXPECT_GE(step.total_seconds, 10 * nap);
  // Each step counted once, however busy the machine: within the fit's own time.
  EXPECT_LE(step.total_seconds, fit_seconds);
  EXPECT_NEAR(step.mean_seconds(), step.total_seconds / 10, 1e-12);
  // The step runs inside the batch, which runs inside the epoch.
  EXPECT_GE(recorded(trainer, "run_training_batch").total_seconds, step.total_seconds);
  EXPECT_GE(recorded(trainer, "run_training_epoch").total_seconds,
            recorded(trainer, "run_training_batch").total_seconds);

  EXPECT_EQ(recorded(trainer, "[LightningModule]Sleepy.on_train_batch_start").calls, 10);
  EXPECT_EQ(recorded(trainer, "[LightningModule]Sleepy.on_train_epoch_end").calls, 2);
  EXPECT_EQ(recorded(trainer, "[LightningModule]Sleepy.configure_optimizers").calls, 1);
  EXPECT_EQ(recorded(trainer, "[Callback]" + counter->state_key() + ".on_train_batch_end").calls, 10);
  EXPECT_EQ(recorded(trainer, "[Callback]" + counter->state_key() + ".on_fit_start").calls, 1);
  EXPECT_EQ(trainer.profiler()->find("[LightningModule]Sleepy.no_such_hook"), nullptr);
}

// Data, forward and backward, the optimizer, logging and checkpoints, with
// as many calls as batches, epochs and validation runs.
TEST(Profiler, RecordsEveryStageOfTheLoops) {
  TempDir dir;
  auto options = quiet(dir, 2);
  options.profiler = "simple";
  options.enable_checkpointing = true;  // a ModelCheckpoint saving after each epoch
  options.num_sanity_val_steps = 2;
  options.loggers = {std::make_shared<RecordingLogger>()};
  options.log_every_n_steps = 1;
  TinyNet model;
  auto train = sequential_loader(40, 8);  // 5 batches
  auto val = sequential_loader(16, 8);    // 2 batches
  Trainer trainer(options);
  ::testing::internal::CaptureStdout();
  trainer.fit(model, train, val);
  trainer.test(model, val);
  const std::string printed = ::testing::internal::GetCapturedStdout();

  const std::map<std::string, int64_t> expected = {
      {"run_training_epoch", 2},
      {"run_training_batch", 10},
      {"[_TrainingEpochLoop].train_dataloader_next", 10},
      {"[Strategy]SingleDeviceStrategy.training_step", 10},
      {"[Strategy]SingleDeviceStrategy.backward", 10},
      {"[LightningModule]TinyNet.optimizer_zero_grad", 10},
      {"[LightningModule]TinyNet.optimizer_step", 10},
      {"[Strategy]SingleDeviceStrategy.optimizer_step", 10},
      {"[LightningModule]TinyNet.on_before_optimizer_step", 10},
      {"[_LoggerConnector].update_train_step_metrics", 10},
      {"[_LoggerConnector].update_train_epoch_metrics", 2},
      {"save_checkpoint", 2},
      // The sanity check's 2 batches and 2 per epoch.
      {"[_EvaluationLoop].val_next", 6},
      {"[Strategy]SingleDeviceStrategy.validation_step", 6},
      {"[_LoggerConnector].update_eval_step_metrics", 6 + 2},
      {"[LightningModule]TinyNet.on_validation_epoch_end", 3},
      {"[_EvaluationLoop].test_next", 2},
      {"[Strategy]SingleDeviceStrategy.test_step", 2},
      {"[LightningModule]TinyNet.setup", 2},  // fit, then test
  };
  for (const auto& [name, calls] : expected) EXPECT_EQ(recorded(trainer, name).calls, calls) << name;
  // A report after each loop, the later one with both loops' records.
  EXPECT_NE(printed.find("FIT Profiler Report"), std::string::npos) << printed;
  const auto test_report = printed.find("TEST Profiler Report");
  ASSERT_NE(test_report, std::string::npos) << printed;
  EXPECT_NE(printed.find("run_training_batch", test_report), std::string::npos);
}

TEST(Profiler, IsOffByDefaultAndPrintsNothing) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(16, 8);
  Trainer trainer(quiet(dir, 1));
  ::testing::internal::CaptureStdout();
  trainer.fit(model, train);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(trainer.profiler(), nullptr);
  EXPECT_EQ(printed.find("Profiler Report"), std::string::npos) << printed;
}

TEST(Profiler, RejectsAnUnknownProfiler) {
  TempDir dir;
  for (const char* name : {"advanced", "pytorch", "xla", "simpler"}) {
    auto options = quiet(dir, 1);
    options.profiler = name;
    TinyNet model;
    auto train = sequential_loader(16, 8);
    Trainer trainer(options);
    try {
      trainer.fit(model, train);
      ADD_FAILURE() << "profiler '" << name << "' was accepted";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("'") + name + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("simple"), std::string::npos) << m;
    }
  }
  // The command line sets it as a string, read in any case as Lightning does.
  auto options = quiet(dir, 1);
  set_option(options, "profiler", "Simple");
  TinyNet model;
  auto train = sequential_loader(16, 8);
  Trainer trainer(options);
  ::testing::internal::CaptureStdout();
  trainer.fit(model, train);
  ::testing::internal::GetCapturedStdout();
  EXPECT_NE(trainer.profiler(), nullptr);
}

// Lightning's table: its title, columns, the Total row, then the actions by
// total time, largest first.
TEST(Profiler, PrintsLightningsReport) {
  TempDir dir;
  auto options = quiet(dir, 1);
  options.profiler = "simple";
  Sleepy model;
  auto train = sequential_loader(24, 8);
  Trainer trainer(options);
  ::testing::internal::CaptureStdout();
  trainer.fit(model, train);
  const std::string printed = ::testing::internal::GetCapturedStdout();

  std::istringstream lines(printed);
  std::string line;
  std::vector<std::string> rows;
  // The report follows fit's "`Trainer.fit` stopped: ..." line.
  while (std::getline(lines, line))
    if (!rows.empty() || line == "FIT Profiler Report") rows.push_back(line);
  ASSERT_GE(rows.size(), 8u) << printed;
  EXPECT_EQ(rows[0], "FIT Profiler Report");
  EXPECT_EQ(rows[1], "");
  EXPECT_EQ(rows[2].find_first_not_of('-'), std::string::npos) << rows[2];
  for (const char* column :
       {"|  Action", "|  Mean duration (s)", "|  Num calls", "|  Total time (s)", "|  Percentage %"})
    EXPECT_NE(rows[3].find(column), std::string::npos) << column;
  EXPECT_EQ(rows[5].rfind("|  Total", 0), 0u) << rows[5];
  EXPECT_NE(rows[5].find("100 %"), std::string::npos) << rows[5];
  // The Total row counts every call; each action row's total is no larger
  // than the previous one's.
  int64_t calls = 0;
  for (const auto& a : trainer.profiler()->actions()) calls += a.calls;
  EXPECT_NE(rows[5].find("|  " + std::to_string(calls) + " "), std::string::npos) << rows[5];
  double previous = 1e300;
  size_t action_rows = 0;
  for (size_t i = 7; i < rows.size() && rows[i].rfind("|  ", 0) == 0; ++i, ++action_rows) {
    const std::string name = rows[i].substr(3, rows[i].find('\t') - 3);
    const auto end = name.find_last_not_of(' ');
    const auto* a = trainer.profiler()->find(name.substr(0, end + 1));
    ASSERT_NE(a, nullptr) << rows[i];
    EXPECT_LE(a->total_seconds, previous) << rows[i];
    previous = a->total_seconds;
  }
  EXPECT_EQ(action_rows, trainer.profiler()->actions().size());
  EXPECT_EQ(rows.back().find_first_not_of('-'), std::string::npos) << rows.back();
}

// The rows as Lightning's Python writes them (strings from Lightning's
// summary() on the same records): f"{x:.5}" numbers, padding and tabs, rules
// as long as the header expanded, the larger total first.
TEST(Profiler, FormatsTheReportAsLightning) {
  SimpleProfiler profiler;
  auto& run = profiler.action("run");
  run.calls = 1;
  run.total_seconds = 0.00012345;
  auto& hook = profiler.action("[a]x.hook");
  hook.calls = 3;
  hook.total_seconds = 12345.6;
  const std::string report = profiler.summary("validate");
  const std::string rule = "\n" + std::string(114, '-') + "\n";
  const std::string header =
      "|  Action   \t|  Mean duration (s)\t|  Num calls      \t|  Total time (s) \t|  Percentage %   \t|";
  EXPECT_EQ(
      report.rfind("VALIDATE Profiler Report\n" + rule + header + rule + "|  Total    \t|  -              \t|  4 ", 0),
      0u)
      << report;
  const auto hook_row = report.find("|  [a]x.hook\t|  4115.2         \t|  3              \t|  1.2346e+04     \t|  ");
  const auto run_row = report.find("|  run      \t|  0.00012345     \t|  1              \t|  0.00012345     \t|  ");
  ASSERT_NE(hook_row, std::string::npos) << report;
  ASSERT_NE(run_row, std::string::npos) << report;
  EXPECT_LT(hook_row, run_row);
  EXPECT_EQ(report.substr(report.size() - rule.size()), rule);
  // Nothing recorded: the title alone.
  EXPECT_EQ(SimpleProfiler().summary("fit"), "FIT Profiler Report\n\n");
}

// With a filename the report is appended to <dirpath>/<stage>-<filename>.txt
// (dirpath "" is the log_dir) and not printed.
TEST(Profiler, WritesTheReportToAFile) {
  TempDir dir;
  auto options = quiet(dir, 1);
  options.profiler = "simple";
  options.profiler_filename = "perf";
  TinyNet model;
  auto train = sequential_loader(16, 8);
  Trainer trainer(options);
  ::testing::internal::CaptureStdout();
  trainer.fit(model, train);
  trainer.validate(model, train);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(printed.find("Profiler Report"), std::string::npos) << printed;
  const auto root = std::filesystem::path(trainer.log_dir());
  EXPECT_EQ(read(root / "fit-perf.txt").rfind("FIT Profiler Report", 0), 0u);
  EXPECT_EQ(read(root / "validate-perf.txt").rfind("VALIDATE Profiler Report", 0), 0u);

  options.profiler_dirpath = (dir.path / "profiles").string();
  Trainer elsewhere(options);
  elsewhere.fit(model, train);
  EXPECT_NE(read(dir.path / "profiles" / "fit-perf.txt").find("run_training_batch"), std::string::npos);
}

}  // namespace
}  // namespace fulgor::testing
