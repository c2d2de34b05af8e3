// Manual optimization, as Lightning 2.6's _ManualOptimization loop
// (loops/optimization/manual.py), LightningModule.manual_backward,
// toggle_optimizer and untoggle_optimizer (core/module.py),
// LightningOptimizer.step (core/optimizer.py), Precision._after_closure
// (plugins/precision/precision.py) and __verify_manual_optimization_support
// (trainer/configuration_validator.py) define it.

#include "../support/tiny.h"

#include "lit_gan.h"  // docs/training.md's LitGAN, as written there

namespace fulgor::testing {
namespace {

using Example = torch::data::Example<>;

// Two parts with objectives of their own, as a GAN's: `a` fits the target,
// `b` fits the negated target; each has its SGD optimizer.
struct TwoPartNet : fulgor::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  std::vector<std::string>* calls = nullptr;
  std::function<void(TwoPartNet&)> in_step;  // runs inside training_step, before the steps
  std::vector<SchedulerConfig> schedulers;
  std::vector<bool> a_required_during_a, b_required_during_a;

  TwoPartNet() {
    a = register_module("a", torch::nn::Linear(4, 1));
    b = register_module("b", torch::nn::Linear(4, 1));
    set_automatic_optimization(false);
  }
  void add(const std::string& hook) {
    if (calls) calls->push_back(hook);
  }

  torch::Tensor training_step(Example batch, int64_t) override {
    add("training_step");
    if (in_step) in_step(*this);
    auto& opts = optimizers();
    {
      auto toggled = toggled_optimizer(opts[0]);
      a_required_during_a.push_back(a->weight.requires_grad());
      b_required_during_a.push_back(b->weight.requires_grad());
      auto loss_a = torch::mse_loss(a(batch.data), batch.target);
      opts[0].zero_grad();
      manual_backward(loss_a);
      opts[0].step();
      log("loss_a", loss_a);
    }
    auto toggled = toggled_optimizer(opts[1]);
    auto loss_b = torch::mse_loss(b(batch.data), -batch.target);
    opts[1].zero_grad();
    manual_backward(loss_b);
    opts[1].step();
    return loss_b;
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    add("configure_optimizers");
    auto opt_a = std::make_shared<torch::optim::SGD>(a->parameters(), torch::optim::SGDOptions(0.1));
    auto opt_b = std::make_shared<torch::optim::SGD>(b->parameters(), torch::optim::SGDOptions(0.05));
    fulgor::OptimizerConfig config({opt_a, opt_b});
    if (!schedulers.empty()) {
      for (auto& s : schedulers) s.scheduler = std::make_shared<fulgor::StepLR>(*opt_a, 1, 0.5);
      config.schedulers = schedulers;
    }
    return config;
  }

  int on_train_batch_start(int64_t) override {
    add("on_train_batch_start");
    return 0;
  }
  void on_before_zero_grad(torch::optim::Optimizer&) override { add("on_before_zero_grad"); }
  void optimizer_zero_grad(int64_t, int64_t, torch::optim::Optimizer&) override { add("optimizer_zero_grad"); }
  void on_before_backward(const torch::Tensor&) override { add("on_before_backward"); }
  void on_after_backward() override { add("on_after_backward"); }
  void on_before_optimizer_step(torch::optim::Optimizer&) override { add("on_before_optimizer_step"); }
  void optimizer_step(int64_t, int64_t, torch::optim::Optimizer&, fulgor::OptimizerClosure&) override {
    add("optimizer_step");
  }
  void configure_gradient_clipping(torch::optim::Optimizer&, std::optional<double>, const std::string&) override {
    add("configure_gradient_clipping");
  }
  void on_train_batch_end(const torch::Tensor& loss, int64_t) override {
    add(loss.defined() && !loss.requires_grad() ? "on_train_batch_end(detached loss)" : "on_train_batch_end");
  }
};

// The same training by hand: each batch, part a then part b, each with its
// own loss, plain SGD.
void train_by_hand(TwoPartNet& net, int64_t n, int64_t batch, int epochs) {
  auto data = XY(n, 7);
  torch::optim::SGD opt_a(net.a->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD opt_b(net.b->parameters(), torch::optim::SGDOptions(0.05));
  for (int e = 0; e < epochs; ++e)
    for (int64_t start = 0; start < n; start += batch) {
      auto x = data.x.slice(0, start, start + batch), y = data.y.slice(0, start, start + batch);
      opt_a.zero_grad();
      torch::mse_loss(net.a(x), y).backward();
      opt_a.step();
      opt_b.zero_grad();
      torch::mse_loss(net.b(x), -y).backward();
      opt_b.step();
    }
}

TEST(ManualOptimization, TwoOptimizersTrainAsTheSameLoopByHand) {
  TempDir dir;
  TwoPartNet model, reference;
  copy_parameters(model, reference);
  auto logger = std::make_shared<RecordingLogger>();
  auto o = quiet(dir, 2);
  o.logger = true;
  o.loggers = {logger};
  o.log_every_n_steps = 1;
  Trainer trainer(o);
  auto train = sequential_loader(12, 4);
  auto result = trainer.fit(model, train);

  train_by_hand(reference, 12, 4, 2);
  EXPECT_TRUE(same_parameters(model, reference));
  // Lightning's global_step counts every optimizer's steps: two per batch.
  EXPECT_EQ(result.global_step, 12);
  EXPECT_EQ(trainer.global_step(), 12);
  // The loggers' steps count batches (_batches_that_stepped).
  EXPECT_EQ(logger->steps("loss_a"), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // toggled_optimizer: while part a trains, only its parameters require grad.
  EXPECT_EQ(model.a_required_during_a, std::vector<bool>(6, true));
  EXPECT_EQ(model.b_required_during_a, std::vector<bool>(6, false));
  EXPECT_TRUE(model.a->weight.requires_grad());
  EXPECT_TRUE(model.b->weight.requires_grad());
}

TEST(ManualOptimization, HooksAreThoseOfManualBackwardAndStepNotTheAutomaticLoops) {
  TempDir dir;
  std::vector<std::string> calls;
  TwoPartNet model;
  model.calls = &calls;
  Trainer trainer(quiet(dir, 1));
  auto train = sequential_loader(4, 4);
  trainer.fit(model, train);
  // No optimizer_step, zero_grad or clipping hook: the module does those.
  // on_before_optimizer_step comes from each step (Precision._after_closure);
  // the batch-end hooks get training_step's loss detached (ManualResult).
  const std::vector<std::string> one_optimizer{"on_before_backward", "on_after_backward", "on_before_optimizer_step"};
  std::vector<std::string> expected{"configure_optimizers", "on_train_batch_start", "training_step"};
  for (int i = 0; i < 2; ++i) expected.insert(expected.end(), one_optimizer.begin(), one_optimizer.end());
  expected.push_back("on_train_batch_end(detached loss)");
  EXPECT_EQ(calls, expected);
}

TEST(ManualOptimization, MaxStepsCountsOptimizerSteps) {
  TempDir dir;
  TwoPartNet model;
  auto o = quiet(dir, 10);
  o.max_steps = 6;
  Trainer trainer(o);
  auto train = sequential_loader(40, 4);
  auto result = trainer.fit(model, train);
  EXPECT_EQ(result.reason, StopReason::max_steps);
  EXPECT_EQ(result.global_step, 6);
  EXPECT_EQ(result.epochs_completed, 1);  // stopped in the first epoch, after 3 of its 10 batches
}

TEST(ManualOptimization, SchedulersAreTheModulesToStep) {
  TempDir dir;
  TwoPartNet model;
  model.schedulers.resize(1);
  std::vector<double> lr_seen;
  model.in_step = [&](TwoPartNet& m) {
    auto schedulers = m.lr_schedulers();
    ASSERT_EQ(schedulers.size(), 1u);
    lr_seen.push_back(schedulers[0]->get_last_lr()[0]);
    if (m.trainer().batches_in_epoch() == 1) schedulers[0]->step();
  };
  Trainer trainer(quiet(dir, 2));
  auto train = sequential_loader(8, 4);
  trainer.fit(model, train);
  // The Trainer steps neither per step nor per epoch: only the module's one call per epoch counts.
  EXPECT_EQ(lr_seen, (std::vector<double>{0.1, 0.1, 0.05, 0.05}));
}

TEST(ManualOptimization, ResumeContinuesStepsAndLoggedSteps) {
  TempDir dir;
  TwoPartNet uninterrupted, first_half, resumed;
  copy_parameters(uninterrupted, first_half);
  copy_parameters(uninterrupted, resumed);
  auto train = sequential_loader(8, 4);
  {
    Trainer trainer(quiet(dir, 3));
    trainer.fit(uninterrupted, train);
  }
  const std::string ckpt = (dir.path / "one.ckpt").string();
  {
    Trainer trainer(quiet(dir, 1));
    trainer.fit(first_half, train);
    trainer.save_checkpoint(ckpt);
  }
  auto logger = std::make_shared<RecordingLogger>();
  auto o = quiet(dir, 3);
  o.logger = true;
  o.loggers = {logger};
  o.log_every_n_steps = 1;
  Trainer trainer(o);
  auto result = trainer.fit(resumed, train, {.ckpt_path = ckpt});
  EXPECT_TRUE(same_parameters(resumed, uninterrupted));
  EXPECT_EQ(result.global_step, 12);
  EXPECT_EQ(logger->steps("loss_a"), (std::vector<int64_t>{2, 3, 4, 5}));
}

TEST(ManualOptimization, StepWithAClosureRunsItThroughTheOptimizer) {
  TempDir dir;
  int closure_calls = 0;
  std::vector<std::string> calls;
  torch::Tensor returned;
  struct Net : TwoPartNet {
    std::function<torch::Tensor(Net&, Example&)> step;
    torch::Tensor training_step(Example batch, int64_t) override { return step(*this, batch); }
  } net;
  net.calls = &calls;
  net.step = [&](Net& m, Example& batch) {
    auto& opt = m.optimizers()[0];
    returned = opt.step([&] {
      ++closure_calls;
      opt.zero_grad();
      auto loss = torch::mse_loss(m.a(batch.data), batch.target);
      m.manual_backward(loss);
      return loss;
    });
    return torch::Tensor();
  };
  Trainer trainer(quiet(dir, 1));
  auto train = sequential_loader(8, 4);
  auto result = trainer.fit(net, train);
  EXPECT_EQ(closure_calls, 2);
  EXPECT_EQ(result.global_step, 2);
  ASSERT_TRUE(returned.defined());
  EXPECT_EQ(returned.numel(), 1);
  // The closure runs before the step's hook, as Precision._wrap_closure.
  EXPECT_EQ(std::vector<std::string>(calls.begin() + 2, calls.begin() + 5),
            (std::vector<std::string>{"on_before_backward", "on_after_backward", "on_before_optimizer_step"}));
}

TEST(ManualOptimization, UntoggleKeepsWhatParametersRequiredBefore) {
  TempDir dir;
  TwoPartNet model;
  model.b->bias.set_requires_grad(false);  // frozen by the user before training
  std::vector<bool> bias_during_b;
  model.in_step = [&](TwoPartNet& m) {
    auto& opts = m.optimizers();
    {
      auto toggled = m.toggled_optimizer(opts[1]);
      bias_during_b.push_back(m.b->bias.requires_grad());
      EXPECT_FALSE(m.a->weight.requires_grad());
    }
    EXPECT_TRUE(m.a->weight.requires_grad());
    EXPECT_FALSE(m.b->bias.requires_grad());
  };
  Trainer trainer(quiet(dir, 1));
  auto train = sequential_loader(4, 4);
  trainer.fit(model, train);
  EXPECT_EQ(bias_during_b, std::vector<bool>{false});
  EXPECT_FALSE(model.b->bias.requires_grad());
}

std::string fit_error(TwoPartNet& model, const TrainerOptions& o) {
  Trainer trainer(o);
  auto train = sequential_loader(4, 4);
  try {
    trainer.fit(model, train);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ManualOptimization, RefusesAutomaticClippingAndAccumulation) {
  TempDir dir;
  TwoPartNet model;
  auto o = quiet(dir, 1);
  o.gradient_clip_val = 0.5;
  EXPECT_NE(fit_error(model, o).find("automatic gradient clipping is not supported for manual optimization: remove "
                                     "gradient_clip_val=0.5"),
            std::string::npos);
  o = quiet(dir, 1);
  o.accumulate_grad_batches = 2;
  EXPECT_NE(fit_error(model, o).find("automatic gradient accumulation is not supported for manual optimization: "
                                     "remove accumulate_grad_batches=2"),
            std::string::npos);
}

TEST(ManualOptimization, ManualCallsNeedManualOptimization) {
  TempDir dir;
  std::string backward_error, step_error;
  struct Net : TinyNet {
    std::function<void(Net&)> hook;
    void on_train_batch_end(const torch::Tensor&, int64_t) override { hook(*this); }
  } net;
  net.hook = [&](Net& m) {
    try {
      m.manual_backward(torch::ones({1}, torch::requires_grad()).sum());
    } catch (const ConfigError& e) {
      backward_error = e.what();
    }
    try {
      m.optimizers()[0].step();
    } catch (const Error& e) {
      step_error = e.what();
    }
  };
  Trainer trainer(quiet(dir, 1));
  auto train = sequential_loader(4, 4);
  trainer.fit(net, train);
  EXPECT_NE(backward_error.find("to use manual_backward, turn automatic optimization off"), std::string::npos)
      << backward_error;
  EXPECT_NE(step_error.find("ManualOptimizer::step is for manual optimization"), std::string::npos) << step_error;
  // Outside a fit there are no optimizers to hand out.
  EXPECT_THROW(net.optimizers(), Error);
}

TEST(ManualOptimization, ASchedulerMustBelongToAReturnedOptimizer) {
  TempDir dir;
  TinyNet model;
  torch::optim::SGD stray(model.parameters(), torch::optim::SGDOptions(0.1));
  model.make_optimizers = [&](TinyNet& m) {
    fulgor::OptimizerConfig config(std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1)));
    config.schedulers.push_back({std::make_shared<fulgor::StepLR>(stray, 1)});
    return config;
  };
  Trainer trainer(quiet(dir, 1));
  auto train = sequential_loader(4, 4);
  try {
    trainer.fit(model, train);
    ADD_FAILURE() << "fit accepted a scheduler of another optimizer";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("a scheduler attached to an optimizer it did not return"), std::string::npos)
        << e.what();
  }
}

TEST(ManualOptimization, TheDocsGanTrainsBothParts) {
  TempDir dir;
  torch::manual_seed(3);
  LitGAN model;
  auto generator_before = model.generator->parameters()[0].clone();
  auto discriminator_before = model.discriminator->parameters()[0].clone();
  fulgor::TensorLoader loader(torch::rand({32, 1, 28, 28}) * 2 - 1, torch::zeros({32}), {.batch_size = 8});
  Trainer trainer(quiet(dir, 1));
  auto result = trainer.fit(model, loader);
  EXPECT_EQ(result.global_step, 8);
  EXPECT_FALSE(torch::equal(model.generator->parameters()[0], generator_before));
  EXPECT_FALSE(torch::equal(model.discriminator->parameters()[0], discriminator_before));
  EXPECT_EQ(trainer.callback_metrics().count("g_loss"), 1u);
  EXPECT_EQ(trainer.callback_metrics().count("d_loss"), 1u);
}

}  // namespace
}  // namespace fulgor::testing
