// Lightning's Trainer options inference_mode, reload_dataloaders_every_n_epochs,
// num_nodes, benchmark, barebones, sync_batchnorm (its ddp behaviour: the
// distributed tests) and the check_val_every_n_epoch accessor.

#include <ATen/Context.h>
#include <c10/core/InferenceMode.h>

#include <cstdlib>

#include "../support/launcher_variables.h"
#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

using nlohmann::json;

TEST(LightningOptions, DefaultsAreLightningsAndTravelThroughJsonAndTheCommandLine) {
  const TrainerOptions defaults;
  EXPECT_FALSE(defaults.async_checkpointing);
  EXPECT_TRUE(defaults.inference_mode);
  EXPECT_EQ(defaults.reload_dataloaders_every_n_epochs, 0);
  EXPECT_EQ(defaults.num_nodes, 1);
  EXPECT_FALSE(defaults.benchmark.has_value());
  EXPECT_FALSE(defaults.barebones);
  EXPECT_FALSE(defaults.sync_batchnorm);
  EXPECT_TRUE(json(defaults)["benchmark"].is_null());

  const char* argv[] = {"prog",
                        "--trainer.async_checkpointing=true",
                        "--trainer.inference_mode=false",
                        "--trainer.reload_dataloaders_every_n_epochs=2",
                        "--trainer.num_nodes=4",
                        "--trainer.benchmark=true",
                        "--trainer.barebones=true",
                        "--trainer.sync_batchnorm=true"};
  const TrainerOptions parsed = parse_command_line(8, argv, {}).trainer;
  EXPECT_TRUE(parsed.async_checkpointing);
  EXPECT_FALSE(parsed.inference_mode);
  EXPECT_EQ(parsed.reload_dataloaders_every_n_epochs, 2);
  EXPECT_EQ(parsed.num_nodes, 4);
  EXPECT_EQ(parsed.benchmark, std::optional<bool>(true));
  EXPECT_TRUE(parsed.barebones);
  EXPECT_TRUE(parsed.sync_batchnorm);
  EXPECT_EQ(json(json(parsed).get<TrainerOptions>()), json(parsed));

  const char* unset[] = {"prog", "--trainer.benchmark=null"};
  EXPECT_FALSE(parse_command_line(2, unset, parsed).trainer.benchmark.has_value());
  EXPECT_THROW(json({{"benchmark", 1}}).get<TrainerOptions>(), ConfigError);
  for (auto [key, value] :
       {std::pair<const char*, int64_t>{"num_nodes", 0}, {"reload_dataloaders_every_n_epochs", -1}}) {
    TrainerOptions o;
    set_option(o, key, std::to_string(value));
    try {
      check_options(o);
      ADD_FAILURE() << key << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

// ---- inference_mode --------------------------------------------------------

// Records, per stage, whether its steps ran under InferenceMode, and whether
// gradients were off.
struct GradModeNet : TinyNet {
  std::map<std::string, std::pair<bool, bool>> seen;  // stage -> (inference mode, grad enabled)
  void note(const std::string& stage) {
    seen[stage] = {c10::InferenceMode::is_enabled(), torch::GradMode::is_enabled()};
  }
  void validation_step(torch::data::Example<> batch, int64_t i) override {
    note(trainer().stage() + ":validate");
    TinyNet::validation_step(batch, i);
  }
  void test_step(torch::data::Example<> batch, int64_t i) override {
    note("test");
    TinyNet::test_step(batch, i);
  }
  torch::Tensor predict_step(torch::data::Example<> batch, int64_t i) override {
    note("predict");
    return TinyNet::predict_step(batch, i);
  }
};

// Lightning runs trainer.validate, test and predict under inference_mode
// (no_grad with inference_mode=False) and fit's validation always under
// no_grad: its fit loop makes its validation loop with inference_mode=False.
TEST(LightningOptions, InferenceModeCoversValidateTestAndPredictButNotFitsValidation) {
  auto loader = sequential_loader(8, 4), val = sequential_loader(8, 4);
  for (const bool inference : {true, false}) {
    SCOPED_TRACE(inference ? "inference_mode=true" : "inference_mode=false");
    TempDir dir;
    GradModeNet model;
    auto options = quiet(dir, 1);
    options.inference_mode = inference;
    Trainer trainer(options);
    trainer.fit(model, loader, val);
    trainer.validate(model, loader);
    trainer.test(model, loader);
    const auto predictions = trainer.predict(model, loader);
    using Seen = std::pair<bool, bool>;
    EXPECT_EQ(model.seen.at("fit:validate"), Seen(false, false));
    EXPECT_EQ(model.seen.at("validate:validate"), Seen(inference, false));
    EXPECT_EQ(model.seen.at("test"), Seen(inference, false));
    EXPECT_EQ(model.seen.at("predict"), Seen(inference, false));
    ASSERT_FALSE(predictions.empty());
    EXPECT_EQ(predictions.front().is_inference(), inference);
    EXPECT_FALSE(c10::InferenceMode::is_enabled());
    EXPECT_TRUE(torch::GradMode::is_enabled());
  }
}

// ---- reload_dataloaders_every_n_epochs -------------------------------------

// A data module that records the epoch of each loader request.
struct CountingData : fulgor::DataModule {
  Trainer* trainer = nullptr;
  std::vector<int64_t> train_requests, val_requests;
  XY xy{16, 7};
  fulgor::AnyLoader<> train_loader() override {
    train_requests.push_back(trainer->current_epoch());
    return fulgor::TensorLoader(xy.x.slice(0, 0, 8), xy.y.slice(0, 0, 8), {.batch_size = 4});
  }
  fulgor::AnyLoader<> val_loader() override {
    val_requests.push_back(trainer->current_epoch());
    return fulgor::TensorLoader(xy.x.slice(0, 8), xy.y.slice(0, 8), {.batch_size = 4});
  }
};

// Lightning's _should_reload_train_dl and _should_reload_val_dl: a loader
// is asked for again once `n` epochs have passed since it last was.
TEST(LightningOptions, ReloadDataloadersEveryNEpochsAsksTheDataModuleAgain) {
  for (const auto& [every, expected] : std::vector<std::pair<int64_t, std::vector<int64_t>>>{
           {0, {0}}, {1, {0, 1, 2, 3, 4}}, {2, {0, 2, 4}}, {3, {0, 3}}}) {
    SCOPED_TRACE("reload_dataloaders_every_n_epochs=" + std::to_string(every));
    TempDir dir;
    TinyNet model;
    CountingData data;
    auto options = quiet(dir, 5);
    options.reload_dataloaders_every_n_epochs = every;
    Trainer trainer(options);
    data.trainer = &trainer;
    trainer.fit(model, data);
    EXPECT_EQ(data.train_requests, expected);
    EXPECT_EQ(data.val_requests, expected);
    EXPECT_EQ(trainer.reload_dataloaders_every_n_epochs(), every);
    EXPECT_EQ(model.training_steps, 10);
    EXPECT_EQ(model.validation_steps, 10);
  }
}

// ---- num_nodes --------------------------------------------------------------

using fulgor::test::LauncherVariables;

std::string fit_error(const TrainerOptions& options) {
  TinyNet model;
  auto loader = sequential_loader(8, 4);
  try {
    Trainer(options).fit(model, loader);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

// Checked against the launcher before any process group is made: 2 nodes of
// 2 processes need a world of 4.
TEST(LightningOptions, NumNodesMustBeTheLaunchersNumberOfNodes) {
  TempDir dir;
  auto options = quiet(dir, 1);
  options.num_nodes = 2;
  EXPECT_EQ(fit_error(options),
            "num_nodes=2: a job on several nodes needs a launcher that starts the processes of every node (torchrun, "
            "fulgor-run or srun); this process was started without one");
  {
    LauncherVariables torchrun(fulgor::test::torchrun_rank_zero(2));
    EXPECT_EQ(fit_error(options),
              "num_nodes=2 with 2 processes on this node makes 4 processes, but the launcher (torchrun) started 2: set "
              "num_nodes to the launcher's number of nodes");
    // TorchElasticEnvironment.validate_settings: devices too.
    auto one_device = options;
    one_device.num_nodes = 1;
    one_device.devices = 1;
    EXPECT_EQ(fit_error(one_device),
              "devices=1 selects 1 device per node, but the launcher (torchrun) started 2 processes on this node: set "
              "devices=2 (or \"auto\") to train on what the launcher started");
  }
  options.num_nodes = 1;
  TinyNet model;
  auto loader = sequential_loader(8, 4);
  Trainer trainer(options);
  trainer.fit(model, loader);
  EXPECT_EQ(trainer.num_nodes(), 1);
}

// ---- check_val_every_n_epoch() ---------------------------------------------

TEST(LightningOptions, CheckValEveryNEpochIsTheOptionAndOneUnderFastDevRun) {
  TempDir dir;
  auto options = quiet(dir, 1);
  EXPECT_EQ(Trainer(options).check_val_every_n_epoch(), std::optional<int64_t>(1));
  options.check_val_every_n_epoch = 3;
  EXPECT_EQ(Trainer(options).check_val_every_n_epoch(), std::optional<int64_t>(3));
  options.check_val_every_n_epoch = std::nullopt;
  EXPECT_EQ(Trainer(options).check_val_every_n_epoch(), std::nullopt);
  options.check_val_every_n_epoch = 3;
  options.fast_dev_run = 1;
  EXPECT_EQ(Trainer(options).check_val_every_n_epoch(), std::optional<int64_t>(1));
}

// ---- benchmark ----------------------------------------------------------------

// cuDNN's flag through the CUDA accelerator, which LibTorch keeps in its
// global context with or without CUDA; the CPU has nothing to set.
TEST(LightningOptions, BenchmarkIsCudnnsFlagOnCudaAndNothingOnTheCpu) {
  auto& context = at::globalContext();
  const bool before = context.benchmarkCuDNN();
  auto cuda = AcceleratorRegistry::instance().create("cuda");
  EXPECT_TRUE(cuda->set_benchmark(!before));
  EXPECT_EQ(context.benchmarkCuDNN(), !before);
  EXPECT_TRUE(cuda->set_benchmark(before));
  EXPECT_EQ(context.benchmarkCuDNN(), before);
  EXPECT_FALSE(AcceleratorRegistry::instance().create("cpu")->set_benchmark(!before));
  EXPECT_EQ(context.benchmarkCuDNN(), before);

  TempDir dir;
  TinyNet model;
  auto loader = sequential_loader(8, 4);
  auto options = quiet(dir, 1);
  options.benchmark = !before;
  Trainer(options).fit(model, loader);
  EXPECT_EQ(context.benchmarkCuDNN(), before);  // the CPU accelerator's: nothing set
}

// ---- barebones ------------------------------------------------------------------

// Lightning's list: checkpointing, loggers and log(), the progress bar, the
// model summary and the sanity check are off, and nothing is written.
TEST(LightningOptions, BarebonesTurnsOffWhatCostsTimePerStep) {
  TempDir dir;
  TinyNet model;
  auto loader = sequential_loader(8, 4), val = sequential_loader(8, 4);
  auto options = quiet(dir.str());  // the opt-outs left on, as by default
  options.enable_checkpointing = options.logger = options.enable_progress_bar = options.enable_model_summary = true;
  options.num_sanity_val_steps = 2;
  options.max_epochs = 2;
  options.barebones = true;
  Trainer trainer(options);
  EXPECT_TRUE(trainer.barebones());
  EXPECT_FALSE(trainer.options().enable_checkpointing);
  EXPECT_FALSE(trainer.options().logger);
  EXPECT_EQ(trainer.num_sanity_val_steps(), 0);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  trainer.fit(model, loader, val);
  const std::string out = ::testing::internal::GetCapturedStdout(), err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(model.validation_runs, 2);  // no sanity check
  EXPECT_EQ(model.training_steps, 4);   // each logging train_loss
  EXPECT_TRUE(trainer.callback_metrics().empty());
  EXPECT_TRUE(trainer.loggers().empty());
  EXPECT_TRUE(std::filesystem::is_empty(dir.path)) << "barebones wrote into the root folder";
  EXPECT_NE(out.find("You are running in `Trainer(barebones=True)` mode. All features that may impact raw speed have "
                     "been disabled to facilitate analyzing the Trainer overhead. Specifically, the following features "
                     "are deactivated:\n - Checkpointing: `Trainer(enable_checkpointing=True)`\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("`Trainer(barebones=True)` started running. The progress bar is disabled so you might want to "
                     "manually print the progress in your model.\n"),
            std::string::npos)
      << out;
  // log() says once per loop that it keeps nothing.
  const std::string said =
      "You are trying to `self.log()` but `Trainer(barebones=True)` is configured. Logging can "
      "impact raw speed so it is disabled under this setting.\n";
  const size_t first = err.find(said);
  EXPECT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find(said, first + 1), std::string::npos) << err;
}

// What barebones cannot turn off is refused with Lightning's words, when a
// loop starts.
TEST(LightningOptions, BarebonesRefusesWhatItWouldHaveToTurnOff) {
  TempDir dir;
  auto base = quiet(dir, 1);
  base.barebones = true;
  auto with = [&](auto change) {
    TrainerOptions o = base;
    change(o);
    return fit_error(o);
  };
  EXPECT_EQ(with([](TrainerOptions& o) { o.fast_dev_run = 1; }),
            "`Trainer(barebones=True, fast_dev_run=1)` was passed. Development run is not meant for raw speed "
            "evaluation so it is disabled in barebones mode.");
  EXPECT_EQ(with([](TrainerOptions& o) { o.detect_anomaly = true; }),
            "`Trainer(barebones=True, detect_anomaly=True)` was passed. Anomaly detection can impact raw speed so it "
            "is disabled in barebones mode.");
  EXPECT_EQ(with([](TrainerOptions& o) { o.profiler = "simple"; }),
            "`Trainer(barebones=True, profiler='simple')` was passed. Profiling can impact raw speed so it is disabled "
            "in barebones mode.");
  EXPECT_EQ(with([](TrainerOptions& o) { o.loggers = {std::make_shared<RecordingLogger>()}; }),
            "`Trainer(barebones=True, logger=[RecordingLogger])` was passed. Logging can impact raw speed so it is "
            "disabled in barebones mode.");
  EXPECT_EQ(with([](TrainerOptions& o) { o.callbacks = {std::make_shared<ModelCheckpoint>()}; }),
            "Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in callbacks list.");
  EXPECT_EQ(with([](TrainerOptions& o) { o.callbacks = {std::make_shared<ProgressBar>()}; }),
            "Trainer was configured with `enable_progress_bar=False` but found `ProgressBar` in callbacks list.");
}

}  // namespace
}  // namespace fulgor::testing
