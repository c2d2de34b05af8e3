// Behaviour that Lightning 2.6.5's source decides and fulgor follows: the
// stop rules of _FitLoop and _TrainingEpochLoop, when the loops set up their
// data, the checkpoint connector's order, the module's hooks for the model's
// mode, its backward pass and its own loaders, the resolved Trainer
// properties, and the messages Lightning prints.

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

// Runs `f`, returning what it wrote to standard output and standard error.
template <typename F>
std::pair<std::string, std::string> parity_output_of(F&& f) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  f();
  std::string out = ::testing::internal::GetCapturedStdout();
  return {out, ::testing::internal::GetCapturedStderr()};
}

size_t parity_count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// _TrainingEpochLoop.done and _should_check_val_fx: EarlyStopping asks to stop
// at the first validation, min_steps=20 with 8 batches an epoch keeps training
// (saying so once) and validating at the epochs' ends, and the stop is honoured
// after step 20 with one more validation: 3 runs, as Lightning.
TEST(LightningParity, AStopBeforeMinStepsKeepsValidatingUntilTheyAreMet) {
  TempDir dir;
  TinyNet model;
  model.scripted_val = {0.01};
  auto stopper =
      std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "val_loss", .stopping_threshold = 0.1});
  auto options = quiet(dir, 10, {stopper});
  options.min_steps = 20;
  auto train = sequential_loader(64, 8);
  auto val = sequential_loader(16, 8);
  Trainer trainer(options);
  FitResult result;
  const auto [out, err] = parity_output_of([&] { result = trainer.fit(model, train, val); });
  EXPECT_EQ(model.validation_runs, 3);
  EXPECT_EQ(trainer.global_step(), 20);
  EXPECT_EQ(trainer.current_epoch(), 3);  // the epoch cut short counts
  EXPECT_EQ(result.reason, StopReason::requested);
  EXPECT_EQ(parity_count(out,
                         "Trainer was signaled to stop but the required `min_epochs=1` or `min_steps=20` has not been "
                         "met. Training will continue...\n"),
            1u);
}

// A stop asked for mid-epoch, once it can be honoured, validates first.
TEST(LightningParity, AStopMidEpochValidatesBeforeLeaving) {
  TempDir dir;
  TinyNet model;
  auto hooks = std::make_shared<Hooks>();
  hooks->batch_end = [](Trainer& t, int64_t i) {
    if (i == 2) t.request_stop("enough");
  };
  auto train = sequential_loader(64, 8);
  auto val = sequential_loader(16, 8);
  Trainer trainer(quiet(dir, 5, {hooks}));
  const auto result = trainer.fit(model, train, val);
  EXPECT_EQ(trainer.global_step(), 3);
  EXPECT_EQ(model.validation_runs, 1);
  EXPECT_EQ(result.reason, StopReason::requested);
  EXPECT_EQ(result.message, "enough");
}

// has_len_all_ranks: an empty loader is named, for training and validation
// alike, and its loop runs no step.
TEST(LightningParity, AnEmptyLoaderIsWarnedAbout) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(0, 8);
  auto val = sequential_loader(0, 8);
  Trainer trainer(quiet(dir, 2));
  const auto [out, err] = parity_output_of([&] { trainer.fit(model, train, val); });
  EXPECT_EQ(trainer.global_step(), 0);
  EXPECT_NE(err.find("The train_loader has no batches: the training loop runs no step. Please make sure this was "
                     "your intention.\n"),
            std::string::npos)
      << err;
  const auto [val_out, val_err] = parity_output_of([&] { trainer.validate(model, val); });
  EXPECT_NE(val_err.find("The val_loader has no batches: the validation loop runs no step."), std::string::npos)
      << val_err;
  EXPECT_EQ(model.validation_runs, 0);
  auto full = sequential_loader(16, 8);
  const auto [out2, quiet_err] = parity_output_of([&] { Trainer(quiet(dir, 1)).fit(model, full); });
  EXPECT_EQ(quiet_err.find("has no batches"), std::string::npos) << quiet_err;
}

// FitLoop.on_advance_end steps the epoch-interval schedulers only when the
// epoch reached its last batch: not after on_train_batch_start's -1.
TEST(LightningParity, AnEpochEndedByMinusOneDoesNotStepEpochSchedulers) {
  struct SkipsRest : TinyNet {
    SkipsRest() {
      make_optimizers = [](TinyNet& m) {
        auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
        fulgor::SchedulerConfig config;
        config.scheduler = std::make_shared<fulgor::StepLR>(*sgd, 1, 0.5);
        return fulgor::OptimizerConfig(sgd, config);
      };
    }
    int on_train_batch_start(int64_t i) override { return trainer().current_epoch() == 0 && i == 1 ? -1 : 0; }
  };
  TempDir dir;
  SkipsRest model;
  auto train = sequential_loader(32, 8);
  Trainer trainer(quiet(dir, 2));
  trainer.fit(model, train);
  EXPECT_EQ(trainer.global_step(), 5);  // 1 batch, then 4
  const auto& group = trainer.optimizers().front()->param_groups().front();
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::SGDOptions&>(group.options()).lr(), 0.05);  // stepped once
}

// FitLoop.on_run_start sets up the validation loader when the first epoch
// validates, so num_val_batches is known before on_train_start, even when no
// validation runs (max_steps ends the fit within the first epoch).
TEST(LightningParity, ValidationBatchesAreKnownOnceFitHasSetUpItsLoaders) {
  struct AtTrainStart : fulgor::Callback {
    std::optional<int64_t> seen;
    void on_train_start(Trainer& t, ModuleBase&) override { seen = t.num_val_batches(); }
  };
  TempDir dir;
  TinyNet model;
  auto probe = std::make_shared<AtTrainStart>();
  auto options = quiet(dir, 1, {probe});
  options.max_steps = 5;
  auto train = sequential_loader(64, 8);
  auto val = sequential_loader(24, 8);
  Trainer trainer(options);
  trainer.fit(model, train, val);
  EXPECT_EQ(model.validation_runs, 0);
  EXPECT_EQ(probe->seen.value_or(-1), 3);
  EXPECT_EQ(trainer.num_val_batches().value_or(-1), 3);
}

// _CheckpointConnector.dump_checkpoint: every callback's state_dict, then
// every callback's on_save_checkpoint, then the module's on_save_checkpoint.
TEST(LightningParity, ACheckpointCollectsTheCallbacksStateBeforeTheModules) {
  static std::vector<std::string> order;
  struct Saving : fulgor::Callback {
    std::string key;
    explicit Saving(std::string k) : key(std::move(k)) {}
    std::string state_key() const override { return key; }
    nlohmann::json state_dict() const override {
      order.push_back(key + ".state_dict");
      return {{"k", key}};
    }
    void on_save_checkpoint(Trainer&, ModuleBase&, nlohmann::json&) override {
      order.push_back(key + ".on_save_checkpoint");
    }
  };
  struct SavingNet : TinyNet {
    void on_save_checkpoint(nlohmann::json&) override { order.push_back("module.on_save_checkpoint"); }
  };
  TempDir dir;
  SavingNet model;
  Trainer trainer(quiet(dir, 1, {std::make_shared<Saving>("a"), std::make_shared<Saving>("b")}));
  auto train = sequential_loader(16, 8);
  trainer.fit(model, train);
  order.clear();
  trainer.save_checkpoint((dir.path / "x.ckpt").string());
  EXPECT_EQ(order, (std::vector<std::string>{"a.state_dict", "b.state_dict", "a.on_save_checkpoint",
                                             "b.on_save_checkpoint", "module.on_save_checkpoint"}));
}

// configure_model builds a layer once the module runs: it is trained on the
// device like the others, and a checkpoint's weights reach it.
TEST(LightningParity, ConfigureModelBuildsLayersTheFitTrains) {
  struct Deferred : fulgor::Module {
    torch::nn::Linear head{nullptr};
    int64_t configured = 0;
    void configure_model() override {
      ++configured;
      if (!head) head = register_module("head", torch::nn::Linear(4, 1));
    }
    torch::Tensor training_step(torch::data::Example<> b, int64_t) override {
      return torch::mse_loss(head(b.data), b.target);
    }
    fulgor::OptimizerConfig configure_optimizers() override {
      return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
    }
  };
  TempDir dir;
  Deferred model;
  auto train = sequential_loader(32, 8);
  Trainer trainer(quiet(dir, 1));
  trainer.fit(model, train);
  ASSERT_TRUE(model.head);
  const torch::Tensor trained = model.head->weight.detach().clone();
  const std::string path = (dir.path / "deferred.ckpt").string();
  trainer.save_checkpoint(path);

  Deferred restored;
  auto no_batches = quiet(dir, 1);
  no_batches.limit_val_batches = int64_t{0};
  Trainer again(no_batches);
  again.validate(restored, train, {.ckpt_path = path});
  EXPECT_EQ(restored.configured, 1);
  EXPECT_TRUE(torch::equal(restored.head->weight, trained));
}

// The module's backward runs the backward pass: one that backpropagates
// nothing leaves the parameters as they were (automatic and manual alike).
TEST(LightningParity, TheModulesBackwardRunsTheBackwardPass) {
  struct NoBackward : TinyNet {
    int64_t calls = 0;
    void backward(const torch::Tensor& loss) override {
      ++calls;
      (loss * 0).backward();
    }
  };
  TempDir dir;
  NoBackward model;
  TinyNet reference;
  copy_parameters(reference, model);
  auto train = sequential_loader(32, 8);
  Trainer(quiet(dir, 1)).fit(model, train);
  EXPECT_EQ(model.calls, 4);
  EXPECT_TRUE(same_parameters(model, reference));
}

// on_validation_model_zero_grad frees the gradients before fit validates; the
// mode hooks put the module in evaluation mode and back.
TEST(LightningParity, ValidationFreesTheGradientsAndRestoresTheMode) {
  struct ModeNet : TinyNet {
    std::vector<std::string> seen;
    void on_validation_start() override {
      seen.push_back(std::string(is_training() ? "training" : "eval") + (l1->weight.grad().defined() ? "+grad" : ""));
    }
    void on_test_model_eval() override { seen.push_back("test_model_eval"); }
  };
  TempDir dir;
  ModeNet model;
  auto train = sequential_loader(32, 8);
  auto val = sequential_loader(16, 8);
  Trainer trainer(quiet(dir, 1));
  trainer.fit(model, train, val);
  EXPECT_EQ(model.seen, (std::vector<std::string>{"eval"}));
  EXPECT_TRUE(model.is_training());
  // A module left in evaluation mode stays in it (the mode is put back).
  model.eval();
  trainer.test(model, val);
  EXPECT_EQ(model.seen.back(), "test_model_eval");  // overridden: no eval() called
  EXPECT_FALSE(model.is_training());
}

// A module without a data module brings its own loaders (Lightning's
// train_dataloader() and the others); without one, the loop says which.
TEST(LightningParity, AModuleBringsItsOwnLoaders) {
  struct SelfFed : TinyNet {
    std::vector<std::string> asked;
    fulgor::AnyLoader<> loader(const char* name, int64_t n) {
      asked.push_back(name);
      XY data(n, 3);
      return fulgor::TensorLoader(data.x, data.y, {.batch_size = 8});
    }
    fulgor::AnyLoader<> train_loader() override { return loader("train", 32); }
    fulgor::AnyLoader<> val_loader() override { return loader("val", 16); }
    fulgor::AnyLoader<> predict_loader() override { return loader("predict", 24); }
  };
  TempDir dir;
  SelfFed model;
  Trainer trainer(quiet(dir, 2));
  trainer.fit(model);
  EXPECT_EQ(trainer.global_step(), 8);
  EXPECT_EQ(model.validation_steps, 4);
  EXPECT_EQ(model.asked, (std::vector<std::string>{"train", "val"}));  // once per fit
  EXPECT_EQ(trainer.validate(model).count("val_loss"), 1u);
  EXPECT_EQ(trainer.predict(model).size(), 3u);
  try {
    trainer.test(model);
    ADD_FAILURE() << "test ran without a test loader";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("::test_loader returned no loader: a module given to test without loaders "
                                         "must override it"),
              std::string::npos)
        << e.what();
  }
}

// The options as the loops follow them (_init_debugging_flags and
// _parse_loop_limits), read through the Trainer's properties.
TEST(LightningParity, TheTrainerTellsTheResolvedLimits) {
  TempDir dir;
  auto options = quiet(dir.str());
  options.fast_dev_run = 3;
  options.num_sanity_val_steps = 2;
  Trainer dev(options);
  EXPECT_EQ(dev.max_steps(), 3);
  EXPECT_EQ(dev.max_epochs(), 1);
  EXPECT_EQ(dev.num_sanity_val_steps(), 0);
  EXPECT_EQ(dev.limit_train_batches(), Limit(3));
  EXPECT_EQ(dev.limit_val_batches(), Limit(3));
  EXPECT_EQ(dev.limit_predict_batches(), Limit(3));

  auto overfit = quiet(dir.str());
  overfit.overfit_batches = 0.25;
  overfit.min_steps = 4;
  Trainer o(overfit);
  EXPECT_EQ(o.limit_train_batches(), Limit(0.25));
  EXPECT_EQ(o.limit_val_batches(), Limit(0.25));
  EXPECT_EQ(o.limit_test_batches(), Limit(1.0));
  EXPECT_EQ(o.min_epochs(), 1);
  EXPECT_EQ(o.max_epochs(), 1000);

  auto every_quarter = quiet(dir, 1);
  every_quarter.val_check_interval = 0.25;
  Trainer q(every_quarter);
  EXPECT_FALSE(q.val_check_batch().has_value());
  TinyNet model;
  auto train = sequential_loader(128, 8);  // 16 batches
  auto val = sequential_loader(16, 8);
  q.fit(model, train, val);
  EXPECT_EQ(q.val_check_batch().value_or(-1), 4);
  EXPECT_EQ(model.validation_runs, 4);
}

// FitLoop.done's and setup_data's messages, word for word.
TEST(LightningParity, FitSaysWhyItStoppedAsLightningDoes) {
  TempDir dir;
  TinyNet model;
  auto options = quiet(dir, 3);
  options.loggers = {std::make_shared<RecordingLogger>()};
  auto train = sequential_loader(32, 8);
  FitResult result;
  const auto [out, err] = parity_output_of([&] { result = Trainer(options).fit(model, train); });
  EXPECT_EQ(result.message, "`Trainer.fit` stopped: `max_epochs=3` reached.");
  EXPECT_NE(out.find("`Trainer.fit` stopped: `max_epochs=3` reached.\n"), std::string::npos) << out;
  EXPECT_NE(err.find("The number of training batches (4) is smaller than the logging interval "
                     "Trainer(log_every_n_steps=50). Set a lower value for log_every_n_steps if you want to see logs "
                     "for the training epoch.\n"),
            std::string::npos)
      << err;

  options.max_steps = 6;
  options.max_epochs = 5;
  EXPECT_EQ(Trainer(options).fit(model, train).message, "`Trainer.fit` stopped: `max_steps=6` reached.");
}

TEST(LightningParity, ANonStrictPlateauSchedulerSaysItSkips) {
  struct Plateau : TinyNet {
    Plateau() {
      make_optimizers = [](TinyNet& m) {
        auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
        fulgor::SchedulerConfig config;
        config.scheduler = std::make_shared<fulgor::ReduceLROnPlateau>(*sgd);
        config.monitor = "missing_metric";
        config.strict = false;
        return fulgor::OptimizerConfig(sgd, config);
      };
    }
  };
  TempDir dir;
  Plateau model;
  auto train = sequential_loader(16, 8);
  const auto [out, err] = parity_output_of([&] { Trainer(quiet(dir, 2)).fit(model, train); });
  EXPECT_EQ(parity_count(err,
                         "ReduceLROnPlateau conditioned on metric missing_metric which is not available but strict is "
                         "set to `False`. Skipping learning rate update.\n"),
            1u)
      << err;
}

// Strict (the default): Lightning's MisconfigurationException text, as a
// ConfigError, listing the metrics logged so far as a Python list.
TEST(LightningParity, AStrictPlateauSchedulerNamesTheAvailableMetrics) {
  TempDir dir;
  TinyNet model;
  model.make_optimizers = [](TinyNet& m) {
    auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
    fulgor::SchedulerConfig config;
    config.scheduler = std::make_shared<fulgor::ReduceLROnPlateau>(*sgd);
    config.monitor = "val_acc";
    config.interval = Interval::step;
    return fulgor::OptimizerConfig(sgd, config);
  };
  auto train = sequential_loader(16, 8);
  try {
    Trainer(quiet(dir, 1)).fit(model, train);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "ReduceLROnPlateau conditioned on metric val_acc which is not available. Available metrics are: "
              "['train_loss']. Condition can be set using `monitor` key in lr scheduler dict");
  }
}

TEST(LightningParity, OverfittingAShufflingLoaderSaysItStopsShuffling) {
  TempDir dir;
  TinyNet model;
  auto options = quiet(dir, 1);
  options.overfit_batches = int64_t{2};
  XY data(32, 5);
  fulgor::TensorLoader train(data.x, data.y, {.batch_size = 8, .shuffle = true, .seed = 1});
  const auto [out, err] = parity_output_of([&] { Trainer(options).fit(model, train); });
  EXPECT_NE(err.find("You requested to overfit but enabled train dataloader shuffling. We are turning off the train "
                     "dataloader shuffling for you.\n"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace fulgor::testing
