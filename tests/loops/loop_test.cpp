// The training loop against hand-written LibTorch loops, and its options.

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

TEST(TrainerLoop, FitEqualsHandWrittenLoop) {
  TempDir dir;
  torch::manual_seed(3);
  TinyNet model(/*dropout=*/0.2), reference(0.2);
  copy_parameters(model, reference);
  auto train = shuffled_loader(40, 8);
  auto val = sequential_loader(16, 8);
  auto options = quiet(dir.str());
  options.max_epochs = 3;
  options.num_sanity_val_steps = 2;  // must not disturb the generators
  Trainer trainer(options);
  torch::manual_seed(11);
  trainer.fit(model, train, val);

  auto loader = shuffled_loader(40, 8);  // RandomSampler draws an order when constructed
  torch::manual_seed(11);
  torch::optim::SGD sgd(reference.parameters(), torch::optim::SGDOptions(0.1));
  reference.train();
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (auto& batch : loader) {
      sgd.zero_grad();
      auto loss = torch::mse_loss(reference.forward(batch.data), batch.target);
      loss.backward();
      sgd.step();
    }
  }
  EXPECT_TRUE(same_parameters(model, reference));
  EXPECT_EQ(trainer.global_step(), 15);
  EXPECT_EQ(trainer.current_epoch(), 3);
}

// The batch-end hooks see each step's loss value, cut from its graph; a loss a
// hook keeps still holds its own step's value after later steps.
TEST(TrainerLoop, BatchEndHooksGetTheLossWithoutItsGraph) {
  struct Seen {
    std::vector<double> values;
    bool any_graph = false;
    void add(const torch::Tensor& loss) {
      values.push_back(loss.item<double>());
      any_graph = any_graph || loss.requires_grad() || loss.grad_fn() != nullptr;
    }
  };
  struct Recorder : TinyNet {
    std::vector<double> returned;
    Seen seen;
    torch::Tensor training_step(torch::data::Example<> batch, int64_t i) override {
      auto loss = TinyNet::training_step(std::move(batch), i);
      returned.push_back(loss.item<double>());
      return loss;
    }
    std::vector<torch::Tensor> kept;  // every other step's
    void on_train_batch_end(const torch::Tensor& loss, int64_t i) override {
      seen.add(loss);
      if (i % 2 == 0) kept.push_back(loss);
    }
  };
  struct Watch : fulgor::Callback {
    Seen seen;
    void on_train_batch_end(Trainer&, ModuleBase&, const torch::Tensor& loss, int64_t) override { seen.add(loss); }
  };
  TempDir dir;
  Recorder model;
  auto watch = std::make_shared<Watch>();
  auto train = sequential_loader(24, 8);
  Trainer(quiet(dir, 2, {watch})).fit(model, train);
  ASSERT_EQ(model.returned.size(), 6u);
  EXPECT_EQ(model.seen.values, model.returned);
  EXPECT_EQ(watch->seen.values, model.returned);
  EXPECT_FALSE(model.seen.any_graph);
  EXPECT_FALSE(watch->seen.any_graph);
  ASSERT_EQ(model.kept.size(), 4u);  // batches 0 and 2 of 0..2, in two epochs
  for (size_t k = 0; k < model.kept.size(); ++k)
    EXPECT_EQ(model.kept[k].item<double>(), model.returned[k < 2 ? 2 * k : 2 * k - 1]) << "kept loss " << k;
}

TEST(TrainerLoop, LimitTrainBatchesRunsExactlyThatManySteps) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(64, 4);
  auto options = quiet(dir.str());
  options.max_epochs = 2;
  options.limit_train_batches = 3;
  Trainer trainer(options);
  trainer.fit(model, train);
  EXPECT_EQ(model.training_steps, 6);
  EXPECT_EQ(trainer.global_step(), 6);

  TinyNet fraction_model;
  options.limit_train_batches = 0.25;  // of 16 batches
  options.max_epochs = 1;
  Trainer fraction(options);
  fraction.fit(fraction_model, train);
  EXPECT_EQ(fraction_model.training_steps, 4);
}

TEST(TrainerLoop, AccumulationStepsAQuarterAsOftenAndMatchesHandWritten) {
  TempDir dir;
  torch::manual_seed(5);
  TinyNet model, reference;
  copy_parameters(model, reference);
  auto train = sequential_loader(64, 4);  // 16 batches
  auto options = quiet(dir.str());
  options.max_epochs = 1;
  options.accumulate_grad_batches = 4;
  Trainer trainer(options);
  trainer.fit(model, train);
  EXPECT_EQ(model.training_steps, 16);
  EXPECT_EQ(trainer.global_step(), 4);

  auto loader = sequential_loader(64, 4);
  torch::optim::SGD sgd(reference.parameters(), torch::optim::SGDOptions(0.1));
  int i = 0;
  sgd.zero_grad();
  for (auto& batch : loader) {
    (torch::mse_loss(reference.forward(batch.data), batch.target) / 4.0).backward();
    if (++i % 4 == 0) {
      sgd.step();
      sgd.zero_grad();
    }
  }
  EXPECT_TRUE(same_parameters(model, reference));
}

// Records the gradient norm the optimizer steps with (after clipping): the
// gradients stay until the next batch zeroes them, as in Lightning.
struct GradNorm : TinyNet {
  double max_norm = 0;
  void on_train_batch_end(const torch::Tensor&, int64_t) override {
    double sq = 0;
    for (auto& p : parameters()) sq += p.grad().pow(2).sum().item<double>();
    max_norm = std::max(max_norm, std::sqrt(sq));
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1e-4));
  }
};

TEST(TrainerLoop, GradientClippingBoundsTheNorm) {
  TempDir dir;
  auto train = sequential_loader(32, 8);
  auto run = [&](std::optional<double> clip, const std::string& algorithm) {
    torch::manual_seed(1);
    GradNorm model;
    {
      torch::NoGradGuard g;
      for (auto& p : model.parameters()) p.mul_(30);  // large gradients
    }
    auto options = quiet(dir.str());
    options.max_epochs = 1;
    options.gradient_clip_val = clip;
    options.gradient_clip_algorithm = algorithm;
    Trainer trainer(options);
    trainer.fit(model, train);
    return model.max_norm;
  };
  EXPECT_GT(run(std::nullopt, "norm"), 1.0);
  EXPECT_LE(run(0.5, "norm"), 0.5 + 1e-4);
  // Clipping each element to 0.01 bounds the norm by 0.01 * sqrt(#elements).
  EXPECT_LE(run(0.01, "value"), 0.01 * std::sqrt(4.0 * 8 + 8 + 8 + 1) + 1e-6);
}

TEST(TrainerLoop, ValCheckIntervalHalfValidatesTwicePerEpoch) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(40, 4);  // 10 batches
  auto val = sequential_loader(8, 4);
  auto options = quiet(dir.str());
  options.max_epochs = 2;
  options.val_check_interval = 0.5;
  Trainer trainer(options);
  trainer.fit(model, train, val);
  EXPECT_EQ(model.validation_runs, 4);
  EXPECT_EQ(model.validation_steps, 8);

  TinyNet every3;
  options.val_check_interval = 3;  // batches
  options.max_epochs = 1;
  Trainer by_count(options);
  by_count.fit(every3, train, val);
  EXPECT_EQ(every3.validation_runs, 3);
}

TEST(TrainerLoop, FastDevRunRunsOneBatchOfEachLoop) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(40, 4);
  auto val = sequential_loader(40, 4);
  auto options = quiet(dir.str());
  options.fast_dev_run = 1;
  options.max_epochs = 10;
  options.num_sanity_val_steps = 2;
  options.enable_checkpointing = true;
  options.logger = true;
  Trainer trainer(options);
  auto result = trainer.fit(model, train, val);
  EXPECT_EQ(model.training_steps, 1);
  EXPECT_EQ(model.validation_steps, 1);
  EXPECT_EQ(trainer.global_step(), 1);
  trainer.test(model, val);
  EXPECT_EQ(model.test_steps, 1);
  // No checkpoints or logs.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
  // fast_dev_run sets max_steps too, which FitLoop.done checks first.
  EXPECT_EQ(result.reason, StopReason::max_steps);
  EXPECT_EQ(result.message, "`Trainer.fit` stopped: `max_steps=1` reached.");
}

// Logs constants so the epoch aggregation can be checked exactly.
struct Constants : TinyNet {
  torch::Tensor training_step(torch::data::Example<> batch, int64_t i) override {
    log("idx", static_cast<double>(i));
    return TinyNet::training_step(std::move(batch), i);
  }
  void validation_step(torch::data::Example<> batch, int64_t i) override {
    log("v", static_cast<double>(i));  // batches of 4, 4, 2
    log("v_sum", 1.0, {.reduce = Reduce::sum});
    log("v_max", static_cast<double>(i), {.reduce = Reduce::max});
    log("v_both", static_cast<double>(i), {.on_step = true, .on_epoch = true});
    log("v_weighted", static_cast<double>(i), {.batch_size = 1});
    (void)batch;
  }
};

// log() reads one-element tensors of every floating type, through views, and
// integral ones, to the same numbers item() gives.
TEST(TrainerLoop, LogReadsOneElementTensorsOfAnyTypeAndView) {
  struct Logs : TinyNet {
    double last_loss = 0;
    torch::Tensor training_step(torch::data::Example<> batch, int64_t i) override {
      auto loss = TinyNet::training_step(std::move(batch), i);
      log("f32", torch::tensor(1.5f));
      log("f64_view", torch::arange(10, torch::kDouble).narrow(0, 7, 1));  // at a storage offset
      log("bf16", torch::tensor(2.5).to(torch::kBFloat16));
      log("f16", torch::tensor(-3.25).to(torch::kHalf));
      log("i64", torch::tensor(int64_t{42}));
      log("neg_view", at::_neg_view(torch::tensor(4.0)));
      log("strided", torch::arange(12.0).view({3, 4}).t().slice(0, 2, 3).slice(1, 1, 2));  // element [1][2]
      log("loss", loss);
      last_loss = loss.item<double>();
      return loss;
    }
  };
  TempDir dir;
  Logs model;
  auto train = sequential_loader(16, 8);
  Trainer trainer(quiet(dir, 1));
  trainer.fit(model, train);
  const auto& m = trainer.callback_metrics();
  EXPECT_EQ(m.at("f32"), 1.5);
  EXPECT_EQ(m.at("f64_view"), 7.0);
  EXPECT_EQ(m.at("bf16"), 2.5);
  EXPECT_EQ(m.at("f16"), -3.25);
  EXPECT_EQ(m.at("i64"), 42.0);
  EXPECT_EQ(m.at("neg_view"), -4.0);
  EXPECT_EQ(m.at("strided"), 6.0);
  EXPECT_EQ(m.at("loss"), model.last_loss);
}

TEST(TrainerLoop, LogDefaultsAndBatchSizeWeightedEpochMeans) {
  TempDir dir;
  Constants model;
  auto train = sequential_loader(12, 4);
  auto val = sequential_loader(10, 4);
  Trainer trainer(quiet(dir.str()));
  auto metrics = trainer.validate(model, val);
  EXPECT_DOUBLE_EQ(metrics.at("v"), (0 * 4 + 1 * 4 + 2 * 2) / 10.0);
  EXPECT_DOUBLE_EQ(metrics.at("v_sum"), 3.0);
  EXPECT_DOUBLE_EQ(metrics.at("v_max"), 2.0);
  EXPECT_DOUBLE_EQ(metrics.at("v_weighted"), 1.0);
  EXPECT_DOUBLE_EQ(metrics.at("v_both_epoch"), 0.8);
  EXPECT_EQ(metrics.count("v_both_step"), 0u);
  // Lightning's callback metrics take no evaluation step values.
  EXPECT_EQ(trainer.callback_metrics().count("v_both_step"), 0u);
  EXPECT_DOUBLE_EQ(trainer.callback_metrics().at("v_both"), 0.8);

  auto options = quiet(dir.str());
  options.max_epochs = 1;
  Trainer fit(options);
  fit.fit(model, train);
  // training_step logs per step by default: the last step's value, no epoch mean.
  EXPECT_DOUBLE_EQ(fit.callback_metrics().at("idx"), 2.0);
  EXPECT_EQ(fit.callback_metrics().count("idx_epoch"), 0u);
}

// The Trainer remembers where the names a step logs live (Note [Metric
// tables] in src/loops/metric_table.h): names logged in changing orders and subsets,
// more names in one step than it remembers, epoch sums and a second fit must
// still each find their own value.
TEST(TrainerLoop, LoggedNamesKeepTheirOwnValuesWhateverTheOrder) {
  struct Shuffled : TinyNet {
    torch::Tensor training_step(torch::data::Example<> batch, int64_t i) override {
      const auto x = static_cast<double>(i);
      if (i % 2 == 1) log("b", 10 * x);
      log("a", x, {.prog_bar = true});
      if (i % 2 == 0) log("c", -x);
      if (i == 3)
        for (int k = 0; k < 70; ++k) log("n" + std::to_string(k), 300.0 + k);
      log("m", 1.0, {.on_step = false, .on_epoch = true, .reduce = Reduce::sum});
      return TinyNet::training_step(std::move(batch), i);
    }
  };
  struct Check : Callback {
    int64_t batches = 0;
    void on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor&, int64_t i) override {
      ++batches;
      const auto& m = trainer.callback_metrics();
      const auto x = static_cast<double>(i);
      EXPECT_EQ(m.at("a"), x);
      EXPECT_EQ(trainer.progress_bar_metrics().at("a"), x);
      EXPECT_EQ(trainer.progress_bar_metrics().count("b"), 0u);
      EXPECT_EQ(m.at(i % 2 == 1 ? "b" : "c"), i % 2 == 1 ? 10 * x : -x);
      for (int k = 0; k < 70 && i >= 3; ++k) EXPECT_EQ(m.at("n" + std::to_string(k)), 300.0 + k) << k;
    }
  };
  TempDir dir;
  Shuffled model;
  auto train = sequential_loader(24, 4);  // 6 batches
  auto check = std::make_shared<Check>();
  Trainer trainer(quiet(dir, 2, {check}));
  for (int fit = 0; fit < 2; ++fit) {
    trainer.fit(model, train);
    EXPECT_EQ(check->batches, 12 * (fit + 1));
    EXPECT_EQ(trainer.callback_metrics().at("a"), 5.0);
    EXPECT_EQ(trainer.callback_metrics().at("m"), 6.0);  // each epoch's own sum
  }
}

TEST(TrainerLoop, SchedulersStepOnTheirInterval) {
  TempDir dir;
  auto train = sequential_loader(16, 4);  // 4 batches
  auto lr_after = [&](Interval interval, int64_t frequency, int64_t epochs, int64_t accumulate = 1) {
    TinyNet model;
    model.make_optimizers = [=](TinyNet& m) {
      auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
      return fulgor::OptimizerConfig(
          sgd, {.scheduler = std::make_shared<StepLR>(*sgd, 1, 0.5), .interval = interval, .frequency = frequency});
    };
    auto options = quiet(dir.str());
    options.max_epochs = epochs;
    options.accumulate_grad_batches = accumulate;
    Trainer trainer(options);
    trainer.fit(model, train);
    return trainer.optimizers().front()->param_groups().front().options().get_lr();
  };
  EXPECT_DOUBLE_EQ(lr_after(Interval::step, 1, 1), 0.1 * std::pow(0.5, 4));
  EXPECT_DOUBLE_EQ(lr_after(Interval::epoch, 1, 1), 0.05);
  EXPECT_DOUBLE_EQ(lr_after(Interval::epoch, 2, 3), 0.05);
  EXPECT_DOUBLE_EQ(lr_after(Interval::step, 2, 1), 0.025);
  // A step scheduler's frequency counts the batches of each epoch, as
  // Lightning's: the 3rd of 4 in each of 3 epochs; with accumulation the
  // batches that step the optimizer (the 2nd and 4th) both step it.
  EXPECT_DOUBLE_EQ(lr_after(Interval::step, 3, 3), 0.1 * std::pow(0.5, 3));
  EXPECT_DOUBLE_EQ(lr_after(Interval::step, 2, 1, 2), 0.025);
}

// The global steps after which a halving StepLR stepped.
struct SchedulerSteps : Callback {
  std::vector<int64_t> at;
  double lr = 0.1;
  void on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor&, int64_t) override {
    const double now = trainer.optimizers().front()->param_groups().front().options().get_lr();
    if (now != lr) at.push_back(trainer.global_step());
    lr = now;
  }
};

OptimizerConfig every_third_batch(TinyNet& m) {
  auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
  return OptimizerConfig(
      sgd, {.scheduler = std::make_shared<StepLR>(*sgd, 1, 0.5), .interval = Interval::step, .frequency = 3});
}

// Lightning's rule, (batch_idx + 1) % frequency == 0 on the batch's index in
// its epoch, skipped while accumulating: with 8 batches an epoch, frequency 3
// steps at batches 3 and 6 of each epoch, global steps 3, 6, 11 and 14 (not
// every third optimizer step: 3, 6, 9, 12, 15); with accumulate_grad_batches
// 2 only the 6th batch both steps the optimizer and is a multiple of 3.
TEST(TrainerLoop, AStepSchedulersFrequencyCountsTheBatchesOfTheEpoch) {
  TempDir dir;
  auto train = sequential_loader(32, 4);  // 8 batches
  for (const int64_t accumulate : {1, 2}) {
    SCOPED_TRACE("accumulate_grad_batches=" + std::to_string(accumulate));
    TinyNet model;
    model.make_optimizers = every_third_batch;
    auto steps = std::make_shared<SchedulerSteps>();
    auto options = quiet(dir, 2, {steps});
    options.accumulate_grad_batches = accumulate;
    Trainer(options).fit(model, train);
    const std::vector<int64_t> expected =
        accumulate == 1 ? std::vector<int64_t>{3, 6, 11, 14} : std::vector<int64_t>{3, 7};
    EXPECT_EQ(steps->at, expected);
  }
}

// A checkpoint saved mid-epoch (after the 4th batch) resumes the batch
// index, and with it the schedule: the same steps and the same final rate.
TEST(TrainerLoop, AResumeMidEpochKeepsTheStepSchedulersBatchCount) {
  TempDir dir;
  auto train = sequential_loader(32, 4);
  TinyNet whole;
  whole.make_optimizers = every_third_batch;
  auto whole_steps = std::make_shared<SchedulerSteps>();
  auto save = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.dirpath = dir.str(), .filename = "{step}", .save_top_k = -1, .every_n_train_steps = 4});
  auto options = quiet(dir, 2, {whole_steps, save});
  options.enable_checkpointing = true;
  Trainer whole_trainer(options);
  whole_trainer.fit(whole, train);
  ASSERT_EQ(whole_steps->at, (std::vector<int64_t>{3, 6, 11, 14}));

  TinyNet resumed;
  resumed.make_optimizers = every_third_batch;
  auto resumed_steps = std::make_shared<SchedulerSteps>();
  resumed_steps->lr = 0.05;  // stepped once before the checkpoint
  Trainer resumed_trainer(quiet(dir, 2, {resumed_steps}));
  resumed_trainer.fit(resumed, train, {.ckpt_path = (dir.path / "step=4.ckpt").string()});
  EXPECT_EQ(resumed_steps->at, (std::vector<int64_t>{6, 11, 14}));
  EXPECT_DOUBLE_EQ(resumed_trainer.optimizers().front()->param_groups().front().options().get_lr(),
                   0.1 * std::pow(0.5, 4));
  EXPECT_TRUE(same_parameters(whole, resumed));
}

TEST(TrainerLoop, PlateauSchedulerReadsTheMonitoredMetric) {
  TempDir dir;
  auto train = sequential_loader(8, 4);
  auto val = sequential_loader(8, 4);
  TinyNet model;
  model.scripted_val = {1.0, 1.0, 1.0, 1.0};
  model.make_optimizers = [](TinyNet& m) {
    auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
    return fulgor::OptimizerConfig(
        sgd, {.scheduler = std::make_shared<ReduceLROnPlateau>(*sgd, PlateauOptions{.factor = 0.5, .patience = 1}),
              .monitor = "val_loss"});
  };
  auto options = quiet(dir.str());
  options.max_epochs = 4;
  Trainer trainer(options);
  trainer.fit(model, train, val);
  // Epoch 1 sets the best; epochs 2 and 3 are bad, the second of them past patience.
  EXPECT_DOUBLE_EQ(trainer.optimizers().front()->param_groups().front().options().get_lr(), 0.05);
}

TEST(TrainerLoop, EarlyStoppingStopsAtTheRightEpoch) {
  TempDir dir;
  TinyNet model;
  model.scripted_val = {1.0, 0.8, 0.85, 0.9, 0.1, 0.1};
  auto train = sequential_loader(8, 4);
  auto val = sequential_loader(8, 4);
  auto stopper = std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "val_loss", .patience = 2});
  auto options = quiet(dir.str());
  options.max_epochs = 10;
  options.callbacks = {stopper};
  Trainer trainer(options);
  auto result = trainer.fit(model, train, val);
  // Improves in epochs 0 and 1, not in 2 and 3: stops after epoch 3.
  EXPECT_EQ(result.reason, StopReason::requested);
  EXPECT_EQ(result.epochs_completed, 4);
  EXPECT_EQ(model.validation_runs, 4);
  EXPECT_EQ(stopper->stopped_epoch(), 3);
  EXPECT_NE(stopper->stopping_reason_message().find("did not improve in the last 2 records"), std::string::npos)
      << stopper->stopping_reason_message();
  EXPECT_EQ(result.message, stopper->stopping_reason_message());

  TinyNet threshold_model;
  threshold_model.scripted_val = {1.0, 0.5, 0.05, 0.01};
  auto threshold = std::make_shared<EarlyStopping>(
      EarlyStoppingOptions{.monitor = "val_loss", .patience = 100, .stopping_threshold = 0.1});
  options.callbacks = {threshold};
  Trainer stopped(options);
  EXPECT_EQ(stopped.fit(threshold_model, train, val).epochs_completed, 3);
  EXPECT_NE(threshold->stopping_reason_message().find("Stopping threshold reached"), std::string::npos);

  // min_epochs overrides a stop request.
  TinyNet min_model;
  min_model.scripted_val = {1.0, 0.5, 0.05, 0.01};
  options.callbacks = {std::make_shared<EarlyStopping>(
      EarlyStoppingOptions{.monitor = "val_loss", .patience = 100, .stopping_threshold = 0.1})};
  options.min_epochs = 5;
  Trainer at_least(options);
  EXPECT_EQ(at_least.fit(min_model, train, val).epochs_completed, 5);
}

// A stop asked for before min_epochs stands until they are done, and from
// then on every step's values are due for the loggers, as in Lightning.
TEST(TrainerLoop, AStopAskedForBeforeMinEpochsWaitsForThem) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(16, 4);
  auto hooks = std::make_shared<Hooks>();
  hooks->batch_end = [](Trainer& t, int64_t i) {
    if (t.current_epoch() == 0 && i == 1) t.request_stop("asked once");
  };
  auto logger = std::make_shared<RecordingLogger>();
  auto options = quiet(dir, 10, {hooks});
  options.loggers = {logger};
  options.min_epochs = 2;
  options.log_every_n_steps = 50;
  Trainer trainer(options);
  const auto result = trainer.fit(model, train);
  EXPECT_EQ(result.reason, StopReason::requested);
  EXPECT_EQ(result.message, "asked once");
  EXPECT_EQ(result.epochs_completed, 2);
  EXPECT_EQ(model.training_steps, 8);
  EXPECT_EQ(logger->steps("train_loss"), (std::vector<int64_t>{2, 3, 4, 5, 6, 7}));
}

// Step values logged in validation_step and test_step carry the number of
// evaluation batches before theirs in the fit or test call (the sanity
// check's not counted) and no epoch, as in Lightning; epoch-end values keep
// the training step.
TEST(TrainerLoop, EvaluationStepValuesCarryTheirOwnBatchCount) {
  struct EvalSteps : TinyNet {
    void validation_step(torch::data::Example<> batch, int64_t i) override {
      log("val_idx", static_cast<double>(i), {.on_step = true, .on_epoch = false});
      TinyNet::validation_step(std::move(batch), i);
    }
    void test_step(torch::data::Example<> batch, int64_t i) override {
      log("test_idx", static_cast<double>(i), {.on_step = true, .on_epoch = false});
      TinyNet::test_step(std::move(batch), i);
    }
  };
  TempDir dir;
  EvalSteps model;
  auto train = sequential_loader(8, 4);  // 2 steps per epoch
  auto val = sequential_loader(12, 4);   // 3 batches per run
  auto logger = std::make_shared<RecordingLogger>();
  auto options = quiet(dir, 2);
  options.loggers = {logger};
  options.num_sanity_val_steps = 2;
  Trainer trainer(options);
  trainer.fit(model, train, val);
  using Series = std::vector<std::pair<int64_t, double>>;
  EXPECT_EQ(logger->series("val_idx"), (Series{{0, 0.0}, {1, 1.0}, {2, 2.0}, {3, 0.0}, {4, 1.0}, {5, 2.0}}));
  EXPECT_EQ(logger->steps("val_loss"), (std::vector<int64_t>{1, 3}));
  for (const auto& [step, metrics] : logger->calls)
    EXPECT_EQ(metrics.count("epoch"), metrics.count("val_idx") ? 0u : 1u) << "step " << step;
  trainer.test(model, val);
  EXPECT_EQ(logger->series("test_idx"), (Series{{0, 0.0}, {1, 1.0}, {2, 2.0}}));
}

TEST(TrainerLoop, SaveTopKKeepsExactlyTheKBestFiles) {
  TempDir dir;
  TinyNet model;
  model.scripted_val = {5.0, 3.0, 4.0, 1.0, 2.0, 6.0};
  auto train = sequential_loader(8, 4);
  auto val = sequential_loader(8, 4);
  auto checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.dirpath = (dir.path / "ckpt").string(),
                                                                             .filename = "{epoch}-{val_loss:.1f}",
                                                                             .monitor = "val_loss",
                                                                             .save_top_k = 2});
  auto options = quiet(dir.str());
  options.max_epochs = 6;
  options.callbacks = {checkpoint};
  Trainer trainer(options);
  trainer.fit(model, train, val);
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path / "ckpt"))
    files.insert(entry.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"epoch=3-val_loss=1.0.ckpt", "epoch=4-val_loss=2.0.ckpt"}));
  EXPECT_EQ(std::filesystem::path(checkpoint->best_model_path()).filename(), "epoch=3-val_loss=1.0.ckpt");
  EXPECT_EQ(checkpoint->best_model_score(), 1.0);
}

TEST(TrainerLoop, PredictAndTestReturnResults) {
  TempDir dir;
  TinyNet model;
  auto data = sequential_loader(10, 4);
  Trainer trainer(quiet(dir.str()));
  auto predictions = trainer.predict(model, data);
  ASSERT_EQ(predictions.size(), 3u);
  EXPECT_EQ(predictions[2].size(0), 2);
  auto metrics = trainer.test(model, data);
  EXPECT_EQ(metrics.count("test_loss"), 1u);
}

TEST(TrainerLoop, BadOptionsAreConfigErrors) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(8, 4);
  auto expect_error = [&](auto change, const std::string& fragment) {
    auto options = quiet(dir.str());
    change(options);
    Trainer trainer(options);
    try {
      trainer.fit(model, train);
      ADD_FAILURE() << "expected a ConfigError mentioning " << fragment;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error([](TrainerOptions& o) { o.strategy = "deepspeed"; }, "known strategies: auto, ddp, fsdp, single_device");
  expect_error([](TrainerOptions& o) { o.precision = "8"; }, "precision '8' is not known; accepted: 32-true");
  expect_error(
      [](TrainerOptions& o) {
        o.devices = 2;
        o.strategy = "single_device";
      },
      "one device");
  expect_error([](TrainerOptions& o) { o.accumulate_grad_batches = 0; }, "accumulate_grad_batches=0");
  expect_error([](TrainerOptions& o) { o.gradient_clip_algorithm = "max"; }, "known: norm, value");
  expect_error([](TrainerOptions& o) { o.limit_train_batches = 1.5; }, "limit_train_batches=1.5");
}

// Hook calls, to show that a fit refused at its start ran none.
struct CountingCallback : Callback {
  int calls = 0;
  void setup(Trainer&, ModuleBase&, const std::string&) override { ++calls; }
  void on_fit_start(Trainer&, ModuleBase&) override { ++calls; }
  void on_train_batch_start(Trainer&, ModuleBase&, int64_t) override { ++calls; }
};

TEST(TrainerLoop, MoreThanOneOptimizerIsRefusedAtFitStart) {
  TempDir dir;
  TinyNet model;
  model.make_optimizers = [](TinyNet& m) {
    return fulgor::OptimizerConfig(std::vector<std::shared_ptr<torch::optim::Optimizer>>{
        std::make_shared<torch::optim::SGD>(m.l1->parameters(), torch::optim::SGDOptions(0.1)),
        std::make_shared<torch::optim::Adam>(m.l2->parameters(), torch::optim::AdamOptions(0.01))});
  };
  auto train = sequential_loader(8, 4);
  auto hooks = std::make_shared<CountingCallback>();
  Trainer trainer(quiet(dir, 1, {hooks}));
  try {
    trainer.fit(model, train);
    ADD_FAILURE() << "fit accepted two optimizers";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("returned 2 optimizers"), std::string::npos) << message;
    EXPECT_NE(message.find("only supported with manual optimization"), std::string::npos) << message;
    EXPECT_NE(message.find("set_automatic_optimization(false)"), std::string::npos) << message;
  }
  EXPECT_EQ(model.training_steps, 0);
  EXPECT_EQ(hooks->calls, 1);  // setup, which comes before configure_optimizers

  // What the message suggests instead: one optimizer, a parameter group each.
  model.make_optimizers = [](TinyNet& m) {
    std::vector<torch::optim::OptimizerParamGroup> groups{
        torch::optim::OptimizerParamGroup(m.l1->parameters()),
        torch::optim::OptimizerParamGroup(m.l2->parameters(), std::make_unique<torch::optim::SGDOptions>(0.01))};
    return fulgor::OptimizerConfig(std::make_shared<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.1)));
  };
  Trainer grouped(quiet(dir, 1));
  EXPECT_NO_THROW(grouped.fit(model, train));
  EXPECT_EQ(model.training_steps, 2);
}

// Remembers the inputs of every training and validation batch.
struct RecordingNet : TinyNet {
  std::vector<torch::Tensor> trained_on, validated_on;
  torch::Tensor training_step(torch::data::Example<> batch, int64_t i) override {
    trained_on.push_back(batch.data.clone());
    return TinyNet::training_step(std::move(batch), i);
  }
  void validation_step(torch::data::Example<> batch, int64_t i) override {
    validated_on.push_back(batch.data.clone());
    TinyNet::validation_step(std::move(batch), i);
  }
};

// Lightning's overfit_batches (trainer/setup.py, _resolve_overfit_batches):
// limit_train_batches and limit_val_batches become overfit_batches, and the
// loaders' shuffling is turned off, so that every epoch trains on the first
// batches of the data and validates on the validation loader's first ones.
TEST(TrainerLoop, OverfitBatchesTrainsOnTheFirstBatchesUnshuffled) {
  TempDir dir;
  const XY data(40, 7), val_data(24, 8);
  TensorLoaderOptions shuffled;
  shuffled.batch_size = 4;
  shuffled.shuffle = true;
  shuffled.seed = 3;
  TensorLoader train(data.x, data.y, shuffled);  // 10 batches, a new order each epoch
  TensorLoader val(val_data.x, val_data.y, shuffled);
  RecordingNet model;
  auto options = quiet(dir.str());
  options.max_epochs = 3;
  options.overfit_batches = 2;
  Trainer trainer(options);
  trainer.fit(model, train, val);

  EXPECT_FALSE(train.options().shuffle);
  EXPECT_FALSE(val.options().shuffle);
  ASSERT_EQ(model.trained_on.size(), 6u);
  EXPECT_EQ(trainer.global_step(), 6);
  for (size_t epoch = 0; epoch < 3; ++epoch)
    for (int64_t b = 0; b < 2; ++b)
      EXPECT_TRUE(torch::equal(model.trained_on[2 * epoch + b], data.x.slice(0, 4 * b, 4 * b + 4)))
          << "epoch " << epoch << " batch " << b;
  ASSERT_EQ(model.validated_on.size(), 6u);
  for (size_t i = 0; i < model.validated_on.size(); ++i) {
    const int64_t b = static_cast<int64_t>(i % 2);
    EXPECT_TRUE(torch::equal(model.validated_on[i], val_data.x.slice(0, 4 * b, 4 * b + 4))) << "validation " << i;
  }
}

// A loader that cannot be told to stop shuffling trains on its first epoch's
// first batches in every epoch.
TEST(TrainerLoop, OverfitBatchesReplaysTheFirstBatchesOfOtherLoaders) {
  TempDir dir;
  torch::manual_seed(4);
  auto train = shuffled_loader(40, 4);
  RecordingNet model;
  auto options = quiet(dir.str());
  options.max_epochs = 2;
  options.overfit_batches = 2;
  Trainer(options).fit(model, train);
  ASSERT_EQ(model.trained_on.size(), 4u);
  EXPECT_FALSE(torch::equal(model.trained_on[0], model.trained_on[1]));
  EXPECT_TRUE(torch::equal(model.trained_on[0], model.trained_on[2]));
  EXPECT_TRUE(torch::equal(model.trained_on[1], model.trained_on[3]));
}

TEST(TrainerLoop, CheckValEveryNEpochValidatesOnlyEveryNthEpoch) {
  TempDir dir;
  auto train = sequential_loader(16, 4);  // 4 batches
  auto val = sequential_loader(8, 4);
  std::vector<int64_t> validated_epochs;
  struct EpochRecorder : Callback {
    std::vector<int64_t>* epochs;
    explicit EpochRecorder(std::vector<int64_t>* e) : epochs(e) {}
    void on_validation_epoch_start(Trainer& t, ModuleBase&) override { epochs->push_back(t.current_epoch()); }
  };
  TinyNet model;
  auto options = quiet(dir.str());
  options.max_epochs = 5;
  options.check_val_every_n_epoch = 2;
  options.callbacks = {std::make_shared<EpochRecorder>(&validated_epochs)};
  Trainer trainer(options);
  trainer.fit(model, train, val);
  EXPECT_EQ(validated_epochs, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(model.validation_steps, 4);
  EXPECT_EQ(model.training_steps, 20);

  // With a count of batches, it still validates only in every Nth epoch,
  // counting batches within that epoch.
  validated_epochs.clear();
  TinyNet by_count;
  options.max_epochs = 4;
  options.val_check_interval = 2;
  Trainer counted(options);
  counted.fit(by_count, train, val);
  EXPECT_EQ(validated_epochs, (std::vector<int64_t>{1, 1, 3, 3}));
}

// FitLoop.on_advance_end counts an epoch that a stop cut short as done
// (epoch_progress.increment_processed / increment_completed), whether the
// stop came from a request or from max_steps.
TEST(TrainerLoop, AnEpochStoppedInItsMiddleCountsAsDone) {
  TempDir dir;
  auto train = sequential_loader(64, 8);  // 8 batches
  struct Look : fulgor::Callback {
    std::vector<int64_t> epochs_at_end;
    void on_train_epoch_end(Trainer& t, ModuleBase&) override { epochs_at_end.push_back(t.current_epoch()); }
  };
  {
    TinyNet model;
    auto hooks = std::make_shared<Hooks>();
    hooks->batch_end = [](Trainer& t, int64_t i) {
      if (t.current_epoch() == 1 && i == 2) t.request_stop("enough");
    };
    auto look = std::make_shared<Look>();
    Trainer trainer(quiet(dir, 5, {hooks, look}));
    const auto result = trainer.fit(model, train);
    EXPECT_EQ(result.reason, StopReason::requested);
    EXPECT_EQ(trainer.global_step(), 11);
    EXPECT_EQ(trainer.current_epoch(), 2);
    EXPECT_EQ(result.epochs_completed, 2);
    EXPECT_EQ(look->epochs_at_end, (std::vector<int64_t>{0, 1}));
  }
  {
    TinyNet model;
    auto options = quiet(dir, 5);
    options.max_steps = 12;
    Trainer trainer(options);
    const auto result = trainer.fit(model, train);
    EXPECT_EQ(result.reason, StopReason::max_steps);
    EXPECT_EQ(trainer.current_epoch(), 2);
    // A checkpoint saved now resumes after that epoch, as Lightning's would.
    const std::string path = (dir.path / "after.ckpt").string();
    trainer.save_checkpoint(path);
    TinyNet resumed_model;
    auto more = quiet(dir, 3);
    Trainer resumed(more);
    resumed.fit(resumed_model, train, {.ckpt_path = path});
    EXPECT_EQ(resumed_model.training_steps, 8);  // epoch 2, in full
    EXPECT_EQ(resumed.global_step(), 20);
  }
}

// FitLoop._can_stop_early: a stop waits for min_steps (and, min_epochs being
// unset, for one epoch: _parse_loop_limits).
TEST(TrainerLoop, AStopAskedForBeforeMinStepsWaitsForThem) {
  TempDir dir;
  auto train = sequential_loader(64, 8);  // 8 batches
  TinyNet model;
  auto hooks = std::make_shared<Hooks>();
  hooks->batch_end = [](Trainer& t, int64_t) {
    if (t.global_step() == 2) t.request_stop("early");
  };
  auto options = quiet(dir, 5, {hooks});
  options.min_steps = 12;
  Trainer trainer(options);
  const auto result = trainer.fit(model, train);
  EXPECT_EQ(result.reason, StopReason::requested);
  EXPECT_EQ(trainer.global_step(), 12);
  EXPECT_EQ(trainer.current_epoch(), 2);

  // min_steps within the first epoch still completes that epoch.
  TinyNet one_epoch;
  options.min_steps = 3;
  Trainer short_run(options);
  short_run.fit(one_epoch, train);
  EXPECT_EQ(short_run.global_step(), 8);
}

}  // namespace
}  // namespace fulgor::testing
