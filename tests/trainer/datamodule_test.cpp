// Data modules, as Lightning 2.6's LightningDataModule and the Trainer's
// handling of one define them: _DataConnector.prepare_data,
// _call_setup_hook and _call_teardown_hook (trainer/call.py), the loops'
// setup_data, _CheckpointConnector.dump_checkpoint / restore_datamodule and
// _log_hyperparams (loggers/utilities.py).

#include "../support/tiny.h"

#include "regression_data.h"  // docs/training.md's RegressionData, as written there

namespace fulgor::testing {
namespace {

using Calls = std::vector<std::string>;

// The regression data of tiny.h, split into training (16), validation (8)
// and test (8) sets of TensorLoaders; records its hooks.
struct XYData : fulgor::DataModule {
  Calls* calls = nullptr;
  torch::Tensor x, y;
  bool with_val = true, with_test = true;
  int64_t batch_size = 4;
  int64_t setups = 0;  // state saved in checkpoints
  int64_t restored = -1;

  explicit XYData(Calls* c = nullptr) : calls(c) { save_hyperparameters({{"batch_size", 4}, {"split", "16/8/8"}}); }
  void add(const std::string& hook) {
    if (calls) calls->push_back("DataModule." + hook);
  }
  void prepare_data() override { add("prepare_data"); }
  void setup(const std::string& stage) override {
    add("setup:" + stage);
    ++setups;
    XY data(32, 7);
    x = data.x;
    y = data.y;
  }
  void teardown(const std::string& stage) override { add("teardown:" + stage); }
  fulgor::AnyLoader<> train_loader() override {
    add("train_loader");
    return fulgor::TensorLoader(x.slice(0, 0, 16), y.slice(0, 0, 16), {.batch_size = batch_size});
  }
  fulgor::AnyLoader<> val_loader() override {
    add("val_loader");
    if (!with_val) return {};
    return fulgor::TensorLoader(x.slice(0, 16, 24), y.slice(0, 16, 24), {.batch_size = batch_size});
  }
  fulgor::AnyLoader<> test_loader() override {
    add("test_loader");
    if (!with_test) return {};
    return fulgor::TensorLoader(x.slice(0, 24), y.slice(0, 24), {.batch_size = batch_size});
  }
  nlohmann::json state_dict() const override { return {{"setups", setups}}; }
  void load_state_dict(const nlohmann::json& state) override {
    add("load_state_dict");
    restored = state.at("setups").get<int64_t>();
  }
};

struct StageRecordingNet : TinyNet {
  Calls* calls;
  explicit StageRecordingNet(Calls* c) : calls(c) {}
  void prepare_data() override { calls->push_back("prepare_data"); }
  void setup(const std::string& stage) override { calls->push_back("setup:" + stage); }
  void teardown(const std::string& stage) override { calls->push_back("teardown:" + stage); }
  void on_fit_start() override { calls->push_back("on_fit_start"); }
  void on_train_start() override { calls->push_back("on_train_start"); }
  void on_validation_start() override { calls->push_back("on_validation_start"); }
  void on_test_start() override { calls->push_back("on_test_start"); }
};

struct SetupCallback : fulgor::Callback {
  Calls* calls;
  explicit SetupCallback(Calls* c) : calls(c) {}
  void setup(Trainer&, ModuleBase&, const std::string& stage) override { calls->push_back("Callback.setup:" + stage); }
  void teardown(Trainer&, ModuleBase&, const std::string& stage) override {
    calls->push_back("Callback.teardown:" + stage);
  }
  void on_sanity_check_start(Trainer&, ModuleBase&) override { calls->push_back("Callback.on_sanity_check_start"); }
  void on_sanity_check_end(Trainer&, ModuleBase&) override { calls->push_back("Callback.on_sanity_check_end"); }
};

TEST(DataModule, HooksAndLoadersComeInLightningsOrder) {
  TempDir dir;
  Calls calls;
  StageRecordingNet model(&calls);
  XYData data(&calls);
  auto o = quiet(dir, 1, {std::make_shared<SetupCallback>(&calls)});
  o.num_sanity_val_steps = 2;
  o.limit_train_batches = Limit(1);
  Trainer trainer(o);
  trainer.fit(model, data);
  // prepare_data, then setup: the data module's, the callbacks', the module's.
  // The validation loader is asked for as the sanity check's validation
  // loop sets up its data, after on_sanity_check_start (Lightning's
  // _run_sanity_check), the training loader as the fit loop sets up its
  // data, after on_sanity_check_end (FitLoop.setup_data); teardown begins
  // with the data module's.
  const Calls expected{"DataModule.prepare_data",
                       "prepare_data",
                       "DataModule.setup:fit",
                       "Callback.setup:fit",
                       "setup:fit",
                       "on_fit_start",
                       "Callback.on_sanity_check_start",
                       "DataModule.val_loader",
                       "on_validation_start",
                       "Callback.on_sanity_check_end",
                       "DataModule.train_loader",
                       "on_train_start",
                       "on_validation_start",
                       "DataModule.teardown:fit",
                       "Callback.teardown:fit",
                       "teardown:fit"};
  EXPECT_EQ(calls, expected);
  EXPECT_EQ(trainer.datamodule(), &data);
  EXPECT_EQ(&data.trainer(), &trainer);

  // Without a sanity check the training loader comes first, and the
  // validation loader before on_train_start (FitLoop.on_run_start).
  calls.clear();
  o.num_sanity_val_steps = 0;
  Trainer again(o);
  again.fit(model, data);
  const auto train = std::find(calls.begin(), calls.end(), "DataModule.train_loader");
  const auto val = std::find(calls.begin(), calls.end(), "DataModule.val_loader");
  const auto train_start = std::find(calls.begin(), calls.end(), "on_train_start");
  ASSERT_NE(train, calls.end());
  EXPECT_LT(train, val);
  EXPECT_LT(val, train_start);

  calls.clear();
  trainer.test(model, data);
  const Calls tested{"DataModule.prepare_data",
                     "prepare_data",
                     "DataModule.setup:test",
                     "Callback.setup:test",
                     "setup:test",
                     "DataModule.test_loader",
                     "on_test_start",
                     "DataModule.teardown:test",
                     "Callback.teardown:test",
                     "teardown:test"};
  EXPECT_EQ(calls, tested);
}

TEST(DataModule, FitsAsWithItsLoadersGivenDirectly) {
  TempDir dir;
  TinyNet with_module, with_loaders;
  copy_parameters(with_module, with_loaders);
  XYData data;
  Trainer a(quiet(dir, 2));
  a.fit(with_module, data);
  EXPECT_GT(with_module.validation_steps, 0);

  XY xy(32, 7);
  fulgor::TensorLoader train(xy.x.slice(0, 0, 16), xy.y.slice(0, 0, 16), {.batch_size = 4});
  fulgor::TensorLoader val(xy.x.slice(0, 16, 24), xy.y.slice(0, 16, 24), {.batch_size = 4});
  Trainer b(quiet(dir, 2));
  b.fit(with_loaders, train, val);
  EXPECT_TRUE(same_parameters(with_module, with_loaders));
  EXPECT_EQ(with_module.validation_steps, with_loaders.validation_steps);
  EXPECT_EQ(a.num_training_batches(), 4);

  auto metrics = a.test(with_module, data);
  EXPECT_EQ(metrics.count("test_loss"), 1u);
  auto predictions = a.validate(with_module, data);
  EXPECT_EQ(predictions.count("val_loss"), 1u);
}

TEST(DataModule, MissingLoadersSkipValidationOrAreErrors) {
  TempDir dir;
  TinyNet model;
  XYData data;
  data.with_val = false;
  Trainer trainer(quiet(dir, 1));
  trainer.fit(model, data);
  EXPECT_EQ(model.validation_steps, 0);
  EXPECT_GT(model.training_steps, 0);

  data.with_test = false;
  try {
    trainer.test(model, data);
    ADD_FAILURE() << "test ran without a test loader";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("XYData::test_loader returned no loader: a data module given to test must "
                                         "override it"),
              std::string::npos)
        << e.what();
  }
  // predict_loader is not overridden.
  EXPECT_THROW(trainer.predict(model, data), ConfigError);
}

TEST(DataModule, ItsStateAndHyperparametersGoIntoCheckpointsAndLoggers) {
  TempDir dir;
  TinyNet model;
  XYData data;
  struct HparamsLogger : RecordingLogger {
    nlohmann::json hparams;
    void log_hyperparams(const nlohmann::json& h) override { hparams = h; }
  };
  auto hparams_logger = std::make_shared<HparamsLogger>();
  model.save_hyperparameters({{"lr", 0.1}, {"batch_size", 4}});
  auto o = quiet(dir, 1);
  o.logger = true;
  o.loggers = {hparams_logger};
  Trainer trainer(o);
  trainer.fit(model, data);
  EXPECT_EQ(hparams_logger->hparams, (nlohmann::json{{"lr", 0.1}, {"batch_size", 4}, {"split", "16/8/8"}}));
  const std::string ckpt = (dir.path / "dm.ckpt").string();
  trainer.save_checkpoint(ckpt);

  XYData resumed_data;
  TinyNet resumed;
  auto more = quiet(dir, 2);
  Trainer second(more);
  second.fit(resumed, resumed_data, {.ckpt_path = ckpt});
  EXPECT_EQ(resumed_data.restored, 1);  // the first fit's setups, read back after this fit's setup

  // The same keys with other values cannot both go to the loggers.
  model.save_hyperparameters({{"batch_size", 8}});
  Trainer third(o);
  try {
    third.fit(model, data);
    ADD_FAILURE() << "conflicting hyper-parameters were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the hyper-parameters batch_size are in both"), std::string::npos) << e.what();
  }
}

TEST(DataModule, AnotherDataModulesStateIsNotRestored) {
  TempDir dir;
  TinyNet model;
  XYData data;
  Trainer trainer(quiet(dir, 1));
  trainer.fit(model, data);
  const std::string ckpt = (dir.path / "dm.ckpt").string();
  trainer.save_checkpoint(ckpt);

  struct OtherData : XYData {};
  OtherData other;
  TinyNet resumed;
  Trainer second(quiet(dir, 2));
  second.fit(resumed, other, {.ckpt_path = ckpt});
  EXPECT_EQ(other.restored, -1);
  // Loaders given directly: the data module's state is left in the file.
  TinyNet plain;
  auto train = sequential_loader(8, 4);
  Trainer third(quiet(dir, 2));
  EXPECT_NO_THROW(third.fit(plain, train, {.ckpt_path = ckpt}));
}

// A named FitOptions or EvalOptions after a data module or a loader is the
// options, as Lightning's ckpt_path keyword is, not a validation loader: the
// fit resumed by it continues from the checkpoint's global step, taking only
// the steps of the epoch the checkpoint leaves.
TEST(DataModule, NamedOptionsObjectsAreTakenAsOptions) {
  TempDir dir;
  TinyNet model;
  XYData data;
  Trainer trainer(quiet(dir, 1));
  trainer.fit(model, data);  // 16 samples in batches of 4: 4 steps
  const std::string ckpt = (dir.path / "named.ckpt").string();
  trainer.save_checkpoint(ckpt);

  fulgor::FitOptions o;
  o.ckpt_path = ckpt;
  const fulgor::FitOptions& by_const_ref = o;
  auto expect_resumed = [](const FitResult& result, const TinyNet& resumed, const char* call) {
    EXPECT_EQ(result.global_step, 8) << call;
    EXPECT_EQ(resumed.training_steps, 4) << call;  // a fresh fit would take 8
  };
  {
    XYData more_data;
    TinyNet resumed;
    Trainer second(quiet(dir, 2));
    expect_resumed(second.fit(resumed, more_data, o), resumed, "fit(model, datamodule, o)");
    EXPECT_EQ(more_data.restored, 1);
  }
  {
    XYData more_data;
    TinyNet resumed;
    Trainer second(quiet(dir, 2));
    expect_resumed(second.fit(resumed, more_data, by_const_ref), resumed, "fit(model, datamodule, const o&)");
  }
  auto train = sequential_loader(16, 4);
  auto val = sequential_loader(8, 4);
  {
    TinyNet resumed, resumed_with_val;
    Trainer second(quiet(dir, 2)), third(quiet(dir, 2));
    expect_resumed(second.fit(resumed, train, o), resumed, "fit(model, loader, o)");
    expect_resumed(third.fit(resumed_with_val, train, val, o), resumed_with_val, "fit(model, train, val, o)");
  }
  {
    TinyNet resumed, resumed_with_val;
    Trainer second(quiet(dir, 2)), third(quiet(dir, 2));
    expect_resumed(second.fit(resumed, train, by_const_ref), resumed, "fit(model, loader, const o&)");
    expect_resumed(third.fit(resumed_with_val, train, val, by_const_ref), resumed_with_val,
                   "fit(model, train, val, const o&)");
  }

  // The evaluation loops load the named options' checkpoint's weights.
  fulgor::EvalOptions e;
  e.ckpt_path = ckpt;
  auto expect_trained_weights = [&](const TinyNet& evaluated, const char* call) {
    const auto trained = model.parameters(), loaded = evaluated.parameters();
    ASSERT_EQ(trained.size(), loaded.size()) << call;
    for (size_t i = 0; i < trained.size(); ++i) EXPECT_TRUE(torch::equal(trained[i], loaded[i])) << call;
  };
  TinyNet validated, tested, predicted;
  XYData eval_data;
  auto test_loader = sequential_loader(8, 4);
  Trainer evaluator(quiet(dir, 1));
  EXPECT_EQ(evaluator.validate(validated, eval_data, e).count("val_loss"), 1u);
  expect_trained_weights(validated, "validate(model, datamodule, e)");
  evaluator.test(tested, test_loader, e);
  expect_trained_weights(tested, "test(model, loader, e)");
  EXPECT_EQ(evaluator.predict(predicted, test_loader, e).size(), 2u);
  expect_trained_weights(predicted, "predict(model, loader, e)");
}

TEST(DataModule, TheDocsDataModuleFitsAndValidates) {
  TempDir dir;
  TinyNet model;
  RegressionData data(32);
  Trainer trainer(quiet(dir, 1));
  trainer.fit(model, data);
  EXPECT_EQ(model.training_steps, 25);   // 800 samples in batches of 32
  EXPECT_EQ(model.validation_steps, 7);  // 200 in batches of 32
  EXPECT_EQ(trainer.validate(model, data).count("val_loss"), 1u);
}

TEST(AnyLoader, PassesTheLoaderProtocolOn) {
  XY xy(10, 7);
  fulgor::AnyLoader<> loader = fulgor::TensorLoader(xy.x, xy.y, {.batch_size = 4, .shuffle = true, .seed = 3});
  ASSERT_FALSE(loader.empty());
  EXPECT_EQ(loader.length().value_or(-1), 3);
  EXPECT_EQ(fulgor::loader_length(loader).value_or(-1), 3);
  EXPECT_TRUE(loader.batches_on(torch::kCPU));

  fulgor::TensorLoader same(xy.x, xy.y, {.batch_size = 4, .shuffle = true, .seed = 3});
  loader.set_epoch(5);
  same.set_epoch(5);
  std::vector<torch::Tensor> ours, theirs;
  for (auto& batch : loader) ours.push_back(batch.data);
  for (auto& batch : same) theirs.push_back(batch.data);
  ASSERT_EQ(ours.size(), 3u);
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(torch::equal(ours[i], theirs[i]));
  EXPECT_TRUE(loader.disable_shuffle());
  // The second of two ranks: 5 samples, in batches of 4.
  EXPECT_TRUE(loader.distribute({.num_replicas = 2, .rank = 1, .even = true}));
  EXPECT_EQ(loader.length().value_or(-1), 2);

  // A LibTorch loader (held by its unique_ptr) tells no length.
  fulgor::AnyLoader<> libtorch = torch::data::make_data_loader(XY(6, 7).map(torch::data::transforms::Stack<>()),
                                                               torch::data::DataLoaderOptions(4));
  EXPECT_FALSE(libtorch.length().has_value());
  int64_t samples = 0;
  for (auto& batch : libtorch) samples += batch.data.size(0);
  EXPECT_EQ(samples, 6);
  EXPECT_FALSE(libtorch.disable_shuffle());
  EXPECT_FALSE(libtorch.distribute({.num_replicas = 2, .rank = 1, .even = true}));
  EXPECT_TRUE(fulgor::AnyLoader<>().empty());
}

}  // namespace
}  // namespace fulgor::testing
