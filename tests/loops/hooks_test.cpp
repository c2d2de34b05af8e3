// The Trainer's hooks, in the order Lightning 2.6 calls them: Trainer._run
// and _call_setup_hook / _call_teardown_hook (trainer/trainer.py,
// trainer/call.py), the checkpoint connector's _restore_modules_and_callbacks
// and restore_training_state, FitLoop, _TrainingEpochLoop, the automatic
// optimization's closure (loops/optimization/automatic.py) and the
// evaluation and prediction loops, with the module's hooks Lightning's own
// tests/tests_pytorch/models/test_hooks.py records.

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

using Calls = std::vector<std::string>;
using Example = torch::data::Example<>;

struct RecordingCallback : fulgor::Callback {
  Calls* calls;
  explicit RecordingCallback(Calls* c) : calls(c) {}
  void add(const std::string& hook) { calls->push_back("Callback." + hook); }

  std::string state_key() const override { return "RecordingCallback"; }
  nlohmann::json state_dict() const override { return {{"kept", true}}; }
  void load_state_dict(const nlohmann::json&) override { add("load_state_dict"); }
  void on_load_checkpoint(Trainer&, ModuleBase&, const nlohmann::json&) override { add("on_load_checkpoint"); }

  void setup(Trainer&, ModuleBase&, const std::string& stage) override { add("setup:" + stage); }
  void teardown(Trainer&, ModuleBase&, const std::string& stage) override { add("teardown:" + stage); }
  void on_fit_start(Trainer&, ModuleBase&) override { add("on_fit_start"); }
  void on_fit_end(Trainer&, ModuleBase&) override { add("on_fit_end"); }
  void on_sanity_check_start(Trainer&, ModuleBase&) override { add("on_sanity_check_start"); }
  void on_sanity_check_end(Trainer&, ModuleBase&) override { add("on_sanity_check_end"); }
  void on_train_start(Trainer&, ModuleBase&) override { add("on_train_start"); }
  void on_train_end(Trainer&, ModuleBase&) override { add("on_train_end"); }
  void on_train_epoch_start(Trainer&, ModuleBase&) override { add("on_train_epoch_start"); }
  void on_train_epoch_end(Trainer&, ModuleBase&) override { add("on_train_epoch_end"); }
  void on_train_batch_start(Trainer&, ModuleBase&, int64_t) override { add("on_train_batch_start"); }
  void on_train_batch_end(Trainer&, ModuleBase&, const torch::Tensor&, int64_t) override { add("on_train_batch_end"); }
  void on_before_zero_grad(Trainer&, ModuleBase&, torch::optim::Optimizer&) override { add("on_before_zero_grad"); }
  void on_before_backward(Trainer&, ModuleBase&, const torch::Tensor&) override { add("on_before_backward"); }
  void on_after_backward(Trainer&, ModuleBase&) override { add("on_after_backward"); }
  void on_before_optimizer_step(Trainer&, ModuleBase&, torch::optim::Optimizer&) override {
    add("on_before_optimizer_step");
  }
  void on_validation_start(Trainer&, ModuleBase&) override { add("on_validation_start"); }
  void on_validation_end(Trainer&, ModuleBase&) override { add("on_validation_end"); }
  void on_validation_epoch_start(Trainer&, ModuleBase&) override { add("on_validation_epoch_start"); }
  void on_validation_epoch_end(Trainer&, ModuleBase&) override { add("on_validation_epoch_end"); }
  void on_validation_batch_start(Trainer&, ModuleBase&, int64_t) override { add("on_validation_batch_start"); }
  void on_validation_batch_end(Trainer&, ModuleBase&, int64_t) override { add("on_validation_batch_end"); }
  void on_test_start(Trainer&, ModuleBase&) override { add("on_test_start"); }
  void on_test_end(Trainer&, ModuleBase&) override { add("on_test_end"); }
  void on_test_epoch_start(Trainer&, ModuleBase&) override { add("on_test_epoch_start"); }
  void on_test_epoch_end(Trainer&, ModuleBase&) override { add("on_test_epoch_end"); }
  void on_test_batch_start(Trainer&, ModuleBase&, int64_t) override { add("on_test_batch_start"); }
  void on_test_batch_end(Trainer&, ModuleBase&, int64_t) override { add("on_test_batch_end"); }
  void on_predict_start(Trainer&, ModuleBase&) override { add("on_predict_start"); }
  void on_predict_end(Trainer&, ModuleBase&) override { add("on_predict_end"); }
  void on_predict_epoch_start(Trainer&, ModuleBase&) override { add("on_predict_epoch_start"); }
  void on_predict_epoch_end(Trainer&, ModuleBase&) override { add("on_predict_epoch_end"); }
  void on_predict_batch_start(Trainer&, ModuleBase&, int64_t) override { add("on_predict_batch_start"); }
  void on_predict_batch_end(Trainer&, ModuleBase&, int64_t) override { add("on_predict_batch_end"); }
};

// The reference scenario's model: Linear(4, 2), trained with SGD(0.1).
struct HookNet : fulgor::Module {
  torch::nn::Linear l{nullptr};
  Calls* calls;
  explicit HookNet(Calls* c) : calls(c) { l = register_module("l", torch::nn::Linear(4, 2)); }
  void add(const std::string& hook) { calls->push_back(hook); }
  torch::Tensor loss_of(const Example& b) { return torch::mse_loss(l(b.data).sum(1, true), b.target); }

  fulgor::OptimizerConfig configure_optimizers() override {
    add("configure_optimizers");
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
  std::vector<std::shared_ptr<Callback>> configure_callbacks() override {
    add("configure_callbacks");
    return {};
  }
  torch::Tensor training_step(Example batch, int64_t) override {
    add("training_step");
    return loss_of(batch);
  }
  void validation_step(Example batch, int64_t) override {
    add("validation_step");
    log("val_loss", loss_of(batch));
  }
  void test_step(Example batch, int64_t) override {
    add("test_step");
    log("test_loss", loss_of(batch));
  }
  torch::Tensor predict_step(Example batch, int64_t) override {
    add("predict_step");
    return l(batch.data);
  }
  Example on_before_batch_transfer(Example batch, int64_t i) override {
    add("on_before_batch_transfer");
    return fulgor::Module::on_before_batch_transfer(std::move(batch), i);
  }
  Example transfer_batch_to_device(Example batch, torch::Device device, int64_t i) override {
    add("transfer_batch_to_device");
    return fulgor::Module::transfer_batch_to_device(std::move(batch), device, i);
  }
  Example on_after_batch_transfer(Example batch, int64_t i) override {
    add("on_after_batch_transfer");
    return fulgor::Module::on_after_batch_transfer(std::move(batch), i);
  }
  void on_load_checkpoint(const nlohmann::json&) override { add("on_load_checkpoint"); }
  void configure_model() override { add("configure_model"); }
  void backward(const torch::Tensor& loss) override {
    add("backward");
    fulgor::Module::backward(loss);
  }
  void on_validation_model_zero_grad() override {
    add("on_validation_model_zero_grad");
    fulgor::Module::on_validation_model_zero_grad();
  }
  void on_validation_model_eval() override {
    add("on_validation_model_eval");
    fulgor::Module::on_validation_model_eval();
  }
  void on_validation_model_train() override {
    add("on_validation_model_train");
    fulgor::Module::on_validation_model_train();
  }
  void on_test_model_eval() override {
    add("on_test_model_eval");
    fulgor::Module::on_test_model_eval();
  }
  void on_test_model_train() override {
    add("on_test_model_train");
    fulgor::Module::on_test_model_train();
  }
  void on_predict_model_eval() override {
    add("on_predict_model_eval");
    fulgor::Module::on_predict_model_eval();
  }
  void setup(const std::string& stage) override { add("setup:" + stage); }
  void teardown(const std::string& stage) override { add("teardown:" + stage); }
  void on_fit_start() override { add("on_fit_start"); }
  void on_fit_end() override { add("on_fit_end"); }
  void on_train_start() override { add("on_train_start"); }
  void on_train_end() override { add("on_train_end"); }
  void on_train_epoch_start() override { add("on_train_epoch_start"); }
  void on_train_epoch_end() override { add("on_train_epoch_end"); }
  int on_train_batch_start(int64_t) override {
    add("on_train_batch_start");
    return 0;
  }
  void on_train_batch_end(const torch::Tensor&, int64_t) override { add("on_train_batch_end"); }
  void on_before_zero_grad(torch::optim::Optimizer&) override { add("on_before_zero_grad"); }
  void optimizer_zero_grad(int64_t epoch, int64_t batch_idx, torch::optim::Optimizer& optimizer) override {
    add("optimizer_zero_grad");
    fulgor::Module::optimizer_zero_grad(epoch, batch_idx, optimizer);
  }
  void on_before_backward(const torch::Tensor&) override { add("on_before_backward"); }
  void on_after_backward() override { add("on_after_backward"); }
  void on_before_optimizer_step(torch::optim::Optimizer&) override { add("on_before_optimizer_step"); }
  void optimizer_step(int64_t epoch, int64_t batch_idx, torch::optim::Optimizer& optimizer,
                      fulgor::OptimizerClosure& closure) override {
    add("optimizer_step");
    fulgor::Module::optimizer_step(epoch, batch_idx, optimizer, closure);
  }
  void configure_gradient_clipping(torch::optim::Optimizer& optimizer, std::optional<double> clip_val,
                                   const std::string& algorithm) override {
    add("configure_gradient_clipping");
    fulgor::Module::configure_gradient_clipping(optimizer, clip_val, algorithm);
  }
  void on_validation_start() override { add("on_validation_start"); }
  void on_validation_end() override { add("on_validation_end"); }
  void on_validation_epoch_start() override { add("on_validation_epoch_start"); }
  void on_validation_epoch_end() override { add("on_validation_epoch_end"); }
  void on_validation_batch_start(int64_t) override { add("on_validation_batch_start"); }
  void on_validation_batch_end(int64_t) override { add("on_validation_batch_end"); }
  void on_test_start() override { add("on_test_start"); }
  void on_test_end() override { add("on_test_end"); }
  void on_test_epoch_start() override { add("on_test_epoch_start"); }
  void on_test_epoch_end() override { add("on_test_epoch_end"); }
  void on_test_batch_start(int64_t) override { add("on_test_batch_start"); }
  void on_test_batch_end(int64_t) override { add("on_test_batch_end"); }
  void on_predict_start() override { add("on_predict_start"); }
  void on_predict_end() override { add("on_predict_end"); }
  void on_predict_epoch_start() override { add("on_predict_epoch_start"); }
  void on_predict_epoch_end() override { add("on_predict_epoch_end"); }
  void on_predict_batch_start(int64_t) override { add("on_predict_batch_start"); }
  void on_predict_batch_end(const torch::Tensor&, int64_t) override { add("on_predict_batch_end"); }
};

// ---- The sequences Lightning's source produces -------------------------------

// _call_callback_hooks, then _call_lightning_module_hook.
void both(Calls& c, const std::string& hook) {
  c.push_back("Callback." + hook);
  c.push_back(hook);
}

void batch_transfer(Calls& c) {
  // _on_before_batch_transfer, then the strategy's batch_to_device.
  for (const char* hook : {"on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"})
    c.push_back(hook);
}

// _TrainingEpochLoop.advance with automatic optimization and no accumulation:
// optimizer_step runs the closure (training_step, zero_grad, backward) through
// optimizer.step, then Precision._after_closure.
void train_batch(Calls& c) {
  batch_transfer(c);
  both(c, "on_train_batch_start");
  c.push_back("optimizer_step");
  c.push_back("training_step");
  both(c, "on_before_zero_grad");
  c.push_back("optimizer_zero_grad");
  both(c, "on_before_backward");
  c.push_back("backward");
  both(c, "on_after_backward");
  both(c, "on_before_optimizer_step");
  c.push_back("configure_gradient_clipping");
  both(c, "on_train_batch_end");
}

// _EvaluationLoop.run / _PredictionLoop.run over `batches` batches; `name` is
// "validation", "test" or "predict". The module's mode hooks come first and
// last (_on_evaluation_model_eval and _train; predict has no _train hook).
void eval_loop(Calls& c, const std::string& name, int batches) {
  c.push_back("on_" + name + "_model_eval");
  both(c, "on_" + name + "_start");
  both(c, "on_" + name + "_epoch_start");
  for (int i = 0; i < batches; ++i) {
    batch_transfer(c);
    both(c, "on_" + name + "_batch_start");
    c.push_back(name + "_step");
    both(c, "on_" + name + "_batch_end");
  }
  both(c, "on_" + name + "_epoch_end");
  both(c, "on_" + name + "_end");
  if (name != "predict") c.push_back("on_" + name + "_model_train");
}

// Trainer._run for fit: `epochs` epochs of two batches, each followed by a
// one-batch validation, after a one-batch sanity check.
Calls fit_calls(bool resumed, int first_epoch, int epochs) {
  Calls c{"configure_callbacks"};
  both(c, "setup:fit");
  c.push_back("configure_model");  // _call_configure_model
  if (resumed) {                   // _restore_modules_and_callbacks
    c.push_back("on_load_checkpoint");
    c.push_back("Callback.on_load_checkpoint");
    c.push_back("Callback.load_state_dict");
  }
  c.push_back("configure_optimizers");  // strategy.setup
  both(c, "on_fit_start");
  // restore_training_state comes here, then _run_sanity_check: a checkpoint
  // saved between epochs does not make the loop restart, so it runs.
  c.push_back("Callback.on_sanity_check_start");
  eval_loop(c, "validation", 1);
  c.push_back("Callback.on_sanity_check_end");
  both(c, "on_train_start");
  for (int e = first_epoch; e < epochs; ++e) {
    both(c, "on_train_epoch_start");
    train_batch(c);
    train_batch(c);
    c.push_back("on_validation_model_zero_grad");  // the last batch stepped
    eval_loop(c, "validation", 1);
    both(c, "on_train_epoch_end");  // a callback that does not monitor
  }
  both(c, "on_train_end");
  both(c, "on_fit_end");
  both(c, "teardown:fit");
  return c;
}

Calls eval_calls(const std::string& stage, const std::string& name, int batches) {
  Calls c{"configure_callbacks"};
  both(c, "setup:" + stage);
  c.push_back("configure_model");
  eval_loop(c, name, batches);
  both(c, "teardown:" + stage);
  return c;
}

TrainerOptions reference_options(const TempDir& dir, Calls* calls) {
  auto o = quiet(dir, 1, {std::make_shared<RecordingCallback>(calls)});
  o.limit_train_batches = int64_t{2};
  o.limit_val_batches = int64_t{1};
  o.limit_test_batches = int64_t{2};
  o.limit_predict_batches = int64_t{2};
  o.num_sanity_val_steps = 1;
  return o;
}

TEST(Hooks, OrderOfFitValidateTestPredictAndResumeIsLightnings) {
  TempDir dir;
  auto train = sequential_loader(64, 8);
  auto val = sequential_loader(32, 8);
  const std::string ckpt = (dir.path / "after_one_epoch.ckpt").string();
  {
    Calls calls;
    HookNet model(&calls);
    Trainer trainer(reference_options(dir, &calls));
    trainer.fit(model, train, val);
    EXPECT_EQ(calls, fit_calls(false, 0, 1));
    trainer.save_checkpoint(ckpt);

    calls.clear();
    trainer.validate(model, val);
    EXPECT_EQ(calls, eval_calls("validate", "validation", 1));
    calls.clear();
    trainer.test(model, val);
    EXPECT_EQ(calls, eval_calls("test", "test", 2));
    calls.clear();
    trainer.predict(model, val);
    EXPECT_EQ(calls, eval_calls("predict", "predict", 2));
  }
  Calls calls;
  HookNet model(&calls);
  auto options = reference_options(dir, &calls);
  options.max_epochs = 2;
  Trainer trainer(options);
  trainer.fit(model, train, val, {.ckpt_path = ckpt});
  EXPECT_EQ(calls, fit_calls(true, 1, 2));
}

// With accumulate_grad_batches=2, a window's first batch zeroes the gradients
// (after its training_step) and its last one steps (the closure's
// _make_zero_grad_fn and _should_accumulate).
TEST(Hooks, AccumulationZeroesOnAWindowsFirstBatchAndStepsOnItsLast) {
  TempDir dir;
  Calls calls;
  HookNet model(&calls);
  auto options = reference_options(dir, &calls);
  options.accumulate_grad_batches = 2;
  options.limit_val_batches = int64_t{0};
  auto train = sequential_loader(64, 8);
  Trainer(options).fit(model, train);
  Calls training;
  for (const auto& call : calls)
    if (call == "training_step" || call == "optimizer_zero_grad" || call == "optimizer_step") training.push_back(call);
  EXPECT_EQ(training, (Calls{"training_step", "optimizer_zero_grad", "optimizer_step", "training_step"}));
}

// Lightning's _call_callback_hooks(..., monitoring_callbacks=False/True)
// around the module's on_train_epoch_end: ModelCheckpoint runs after the
// module, and so sees what the module logged there.
TEST(Hooks, ModelCheckpointSeesWhatTheModuleLogsAtTheEpochsEnd) {
  struct EpochEndLogger : TinyNet {
    void on_train_epoch_end() override { log("epoch_metric", static_cast<double>(10 - trainer().current_epoch())); }
  };
  struct Before : fulgor::Callback {
    bool saw_metric = false;
    void on_train_epoch_end(Trainer& t, ModuleBase&) override {
      if (t.current_epoch() == 0) saw_metric = t.callback_metrics().count("epoch_metric") > 0;
    }
  };
  TempDir dir;
  EpochEndLogger model;
  auto before = std::make_shared<Before>();
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.dirpath = dir.str(), .monitor = "epoch_metric", .mode = "min"});
  auto options = quiet(dir, 2, {checkpoint, before});
  options.enable_checkpointing = true;
  auto train = sequential_loader(64, 8);
  Trainer(options).fit(model, train);
  EXPECT_FALSE(before->saw_metric);  // before the module's hook, in the first epoch
  ASSERT_TRUE(checkpoint->best_model_score().has_value());
  EXPECT_EQ(*checkpoint->best_model_score(), 9.0);
}

// The callbacks' state is loaded after their setup (Lightning's _run), so a
// ModelCheckpoint with the default dirpath, which setup fills, keeps what it
// knew when the checkpoint was saved.
TEST(Hooks, ResumeLoadsCallbackStateAfterTheirSetup) {
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(64, 8);
  auto options = quiet(dir, 1);
  options.enable_checkpointing = true;
  std::string best;
  const std::string after = (dir.path / "after.ckpt").string();
  {
    Trainer trainer(options);
    trainer.fit(model, train);
    best = trainer.checkpoint_callback()->best_model_path();
    ASSERT_FALSE(best.empty());
    trainer.save_checkpoint(after);
  }
  Trainer resumed(options);  // max_epochs=1 is done: nothing new is saved
  resumed.fit(model, train, {.ckpt_path = after});
  EXPECT_EQ(resumed.checkpoint_callback()->best_model_path(), best);
}

// _TrainingEpochLoop.advance: on_train_batch_start returning -1 ends the
// epoch before the batch runs; the next epoch runs in full.
TEST(Hooks, TrainBatchStartReturningMinusOneSkipsTheRestOfTheEpoch) {
  struct Skipper : TinyNet {
    int on_train_batch_start(int64_t batch_idx) override {
      return trainer().current_epoch() == 0 && batch_idx == 3 ? -1 : 0;
    }
  };
  TempDir dir;
  Skipper model;
  auto train = sequential_loader(64, 8);
  Trainer trainer(quiet(dir, 2));
  trainer.fit(model, train);
  EXPECT_EQ(model.training_steps, 3 + 8);
  EXPECT_EQ(trainer.global_step(), 11);
  EXPECT_EQ(trainer.current_epoch(), 2);
}

// An optimizer_step override changes the step, as Lightning's documented
// learning-rate warm-up does, and still runs the closure.
TEST(Hooks, OptimizerStepOverrideWarmsUpTheLearningRate) {
  struct WarmUp : TinyNet {
    std::vector<double> rates;
    void optimizer_step(int64_t epoch, int64_t batch_idx, torch::optim::Optimizer& optimizer,
                        fulgor::OptimizerClosure& closure) override {
      const auto step = trainer().global_step();
      for (auto& group : optimizer.param_groups())
        group.options().set_lr(0.1 * std::min(1.0, static_cast<double>(step + 1) / 4.0));
      rates.push_back(optimizer.param_groups()[0].options().get_lr());
      TinyNet::optimizer_step(epoch, batch_idx, optimizer, closure);
    }
  };
  TempDir dir;
  WarmUp model;
  auto train = sequential_loader(48, 8);
  Trainer trainer(quiet(dir, 1));
  trainer.fit(model, train);
  ASSERT_EQ(model.rates.size(), 6u);
  for (size_t i = 0; i < model.rates.size(); ++i)
    EXPECT_DOUBLE_EQ(model.rates[i], 0.1 * std::min(1.0, static_cast<double>(i + 1) / 4.0)) << "step " << i;
  EXPECT_EQ(model.training_steps, 6);
  EXPECT_EQ(trainer.global_step(), 6);
}

// The batch transfer hooks change what the steps get, in their order.
TEST(Hooks, BatchTransferHooksShapeTheBatchTheStepsGet) {
  struct Shifted : TinyNet {
    std::vector<double> seen;
    Example on_before_batch_transfer(Example b, int64_t) override {
      b.data = b.data * 0 + 1;
      return b;
    }
    Example on_after_batch_transfer(Example b, int64_t) override {
      b.data = b.data + 1;
      return b;
    }
    void validation_step(Example b, int64_t) override { seen.push_back(b.data.mean().item<double>()); }
  };
  TempDir dir;
  Shifted model;
  auto val = sequential_loader(16, 8);
  Trainer(quiet(dir, 1)).validate(model, val);
  EXPECT_EQ(model.seen, (std::vector<double>{2.0, 2.0}));
}

// Lightning's _attach_model_callbacks: a module's callback replaces the
// Trainer's of its type, the others stay, and ModelCheckpoints go last.
TEST(Hooks, ConfigureCallbacksReplacesSameTypeAndPutsCheckpointsLast) {
  struct Marker : fulgor::Callback {
    int id;
    explicit Marker(int i) : id(i) {}
  };
  struct Other : fulgor::Callback {};
  struct WithCallbacks : TinyNet {
    std::vector<std::shared_ptr<Callback>> configure_callbacks() override { return {std::make_shared<Marker>(2)}; }
  };
  TempDir dir;
  auto checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.dirpath = dir.str()});
  auto other = std::make_shared<Other>();
  auto options = quiet(dir, 1, {std::make_shared<Marker>(1), checkpoint, other});
  options.enable_checkpointing = true;
  Trainer trainer(options);
  WithCallbacks model;
  auto train = sequential_loader(16, 8);
  trainer.fit(model, train);
  const auto& callbacks = trainer.callbacks();
  ASSERT_EQ(callbacks.size(), 3u);
  EXPECT_EQ(callbacks[0], other);
  auto* marker = dynamic_cast<Marker*>(callbacks[1].get());
  ASSERT_NE(marker, nullptr);
  EXPECT_EQ(marker->id, 2);
  EXPECT_EQ(callbacks[2], checkpoint);
}

// configure_gradient_clipping receives the Trainer's clipping options, and an
// override decides the clipping; lr_scheduler_step steps the schedulers.
TEST(Hooks, ClippingAndSchedulerHooksReceiveTheTrainersSettings) {
  struct Custom : TinyNet {
    std::vector<std::pair<std::optional<double>, std::string>> clip_calls;
    int64_t scheduler_steps = 0;
    Custom() {
      make_optimizers = [](TinyNet& self) {
        auto sgd = std::make_shared<torch::optim::SGD>(self.parameters(), torch::optim::SGDOptions(0.1));
        fulgor::OptimizerConfig config(sgd);
        config.schedulers.push_back({std::make_shared<fulgor::StepLR>(*sgd, 1, 0.5)});
        return config;
      };
    }
    void configure_gradient_clipping(torch::optim::Optimizer&, std::optional<double> clip_val,
                                     const std::string& algorithm) override {
      clip_calls.emplace_back(clip_val, algorithm);
    }
    void lr_scheduler_step(fulgor::LRScheduler& scheduler, std::optional<double> metric) override {
      ++scheduler_steps;
      TinyNet::lr_scheduler_step(scheduler, metric);
    }
  };
  TempDir dir;
  Custom model;
  auto options = quiet(dir, 2);
  options.gradient_clip_val = 0.5;
  options.gradient_clip_algorithm = "value";
  auto train = sequential_loader(16, 8);
  Trainer trainer(options);
  trainer.fit(model, train);
  ASSERT_EQ(model.clip_calls.size(), 4u);
  EXPECT_EQ(model.clip_calls[0].first, 0.5);
  EXPECT_EQ(model.clip_calls[0].second, "value");
  EXPECT_EQ(model.scheduler_steps, 2);  // one per epoch
  EXPECT_DOUBLE_EQ(trainer.optimizers()[0]->param_groups()[0].options().get_lr(), 0.025);
}

// Lightning's _call_and_handle_interrupt: on an exception the callbacks'
// on_exception runs and the loggers are finalized as failed, in every loop.
TEST(Hooks, AnExceptionInValidateReachesCallbacksAndFinalizesLoggers) {
  struct Failing : TinyNet {
    void validation_step(Example, int64_t) override { throw std::runtime_error("broken step"); }
  };
  struct Watch : fulgor::Callback {
    std::string seen;
    void on_exception(Trainer&, ModuleBase&, const std::exception& e) override { seen = e.what(); }
  };
  struct FinalLogger : RecordingLogger {
    std::string status;
    void finalize(const std::string& s) override { status = s; }
  };
  TempDir dir;
  Failing model;
  auto watch = std::make_shared<Watch>();
  auto logger = std::make_shared<FinalLogger>();
  auto options = quiet(dir, 1, {watch});
  options.loggers = {logger};
  auto val = sequential_loader(16, 8);
  Trainer trainer(options);
  EXPECT_THROW(trainer.validate(model, val), std::runtime_error);
  EXPECT_EQ(watch->seen, "broken step");
  EXPECT_EQ(logger->status, "failed");
}

}  // namespace
}  // namespace fulgor::testing
