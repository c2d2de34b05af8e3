// LambdaCallback and OnExceptionCheckpoint, as Lightning's.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

// Every hook, recorded by name, the way a class would.
struct HookNames : Callback {
  std::vector<std::string> names;
  void setup(Trainer&, ModuleBase&, const std::string&) override { names.push_back("setup"); }
  void teardown(Trainer&, ModuleBase&, const std::string&) override { names.push_back("teardown"); }
  void on_fit_start(Trainer&, ModuleBase&) override { names.push_back("on_fit_start"); }
  void on_fit_end(Trainer&, ModuleBase&) override { names.push_back("on_fit_end"); }
  void on_sanity_check_start(Trainer&, ModuleBase&) override { names.push_back("on_sanity_check_start"); }
  void on_sanity_check_end(Trainer&, ModuleBase&) override { names.push_back("on_sanity_check_end"); }
  void on_train_start(Trainer&, ModuleBase&) override { names.push_back("on_train_start"); }
  void on_train_end(Trainer&, ModuleBase&) override { names.push_back("on_train_end"); }
  void on_train_epoch_start(Trainer&, ModuleBase&) override { names.push_back("on_train_epoch_start"); }
  void on_train_epoch_end(Trainer&, ModuleBase&) override { names.push_back("on_train_epoch_end"); }
  void on_train_batch_start(Trainer&, ModuleBase&, int64_t) override { names.push_back("on_train_batch_start"); }
  void on_train_batch_end(Trainer&, ModuleBase&, const torch::Tensor&, int64_t) override {
    names.push_back("on_train_batch_end");
  }
  void on_before_zero_grad(Trainer&, ModuleBase&, torch::optim::Optimizer&) override {
    names.push_back("on_before_zero_grad");
  }
  void on_before_backward(Trainer&, ModuleBase&, const torch::Tensor&) override {
    names.push_back("on_before_backward");
  }
  void on_after_backward(Trainer&, ModuleBase&) override { names.push_back("on_after_backward"); }
  void on_before_optimizer_step(Trainer&, ModuleBase&, torch::optim::Optimizer&) override {
    names.push_back("on_before_optimizer_step");
  }
  void on_validation_start(Trainer&, ModuleBase&) override { names.push_back("on_validation_start"); }
  void on_validation_end(Trainer&, ModuleBase&) override { names.push_back("on_validation_end"); }
  void on_validation_epoch_start(Trainer&, ModuleBase&) override { names.push_back("on_validation_epoch_start"); }
  void on_validation_epoch_end(Trainer&, ModuleBase&) override { names.push_back("on_validation_epoch_end"); }
  void on_validation_batch_start(Trainer&, ModuleBase&, int64_t) override {
    names.push_back("on_validation_batch_start");
  }
  void on_validation_batch_end(Trainer&, ModuleBase&, int64_t) override { names.push_back("on_validation_batch_end"); }
  void on_test_start(Trainer&, ModuleBase&) override { names.push_back("on_test_start"); }
  void on_test_end(Trainer&, ModuleBase&) override { names.push_back("on_test_end"); }
  void on_test_epoch_start(Trainer&, ModuleBase&) override { names.push_back("on_test_epoch_start"); }
  void on_test_epoch_end(Trainer&, ModuleBase&) override { names.push_back("on_test_epoch_end"); }
  void on_test_batch_start(Trainer&, ModuleBase&, int64_t) override { names.push_back("on_test_batch_start"); }
  void on_test_batch_end(Trainer&, ModuleBase&, int64_t) override { names.push_back("on_test_batch_end"); }
  void on_predict_start(Trainer&, ModuleBase&) override { names.push_back("on_predict_start"); }
  void on_predict_end(Trainer&, ModuleBase&) override { names.push_back("on_predict_end"); }
  void on_predict_epoch_start(Trainer&, ModuleBase&) override { names.push_back("on_predict_epoch_start"); }
  void on_predict_epoch_end(Trainer&, ModuleBase&) override { names.push_back("on_predict_epoch_end"); }
  void on_predict_batch_start(Trainer&, ModuleBase&, int64_t) override { names.push_back("on_predict_batch_start"); }
  void on_predict_batch_end(Trainer&, ModuleBase&, int64_t) override { names.push_back("on_predict_batch_end"); }
  void on_save_checkpoint(Trainer&, ModuleBase&, nlohmann::json&) override { names.push_back("on_save_checkpoint"); }
  void on_load_checkpoint(Trainer&, ModuleBase&, const nlohmann::json&) override {
    names.push_back("on_load_checkpoint");
  }
  void on_exception(Trainer&, ModuleBase&, const std::exception&) override { names.push_back("on_exception"); }
};

LambdaHooks recording_hooks(const std::shared_ptr<std::vector<std::string>>& names) {
  LambdaHooks h;
  h.setup = [names](auto&&...) { names->push_back("setup"); };
  h.teardown = [names](auto&&...) { names->push_back("teardown"); };
  h.on_fit_start = [names](auto&&...) { names->push_back("on_fit_start"); };
  h.on_fit_end = [names](auto&&...) { names->push_back("on_fit_end"); };
  h.on_sanity_check_start = [names](auto&&...) { names->push_back("on_sanity_check_start"); };
  h.on_sanity_check_end = [names](auto&&...) { names->push_back("on_sanity_check_end"); };
  h.on_train_start = [names](auto&&...) { names->push_back("on_train_start"); };
  h.on_train_end = [names](auto&&...) { names->push_back("on_train_end"); };
  h.on_train_epoch_start = [names](auto&&...) { names->push_back("on_train_epoch_start"); };
  h.on_train_epoch_end = [names](auto&&...) { names->push_back("on_train_epoch_end"); };
  h.on_train_batch_start = [names](auto&&...) { names->push_back("on_train_batch_start"); };
  h.on_train_batch_end = [names](auto&&...) { names->push_back("on_train_batch_end"); };
  h.on_before_zero_grad = [names](auto&&...) { names->push_back("on_before_zero_grad"); };
  h.on_before_backward = [names](auto&&...) { names->push_back("on_before_backward"); };
  h.on_after_backward = [names](auto&&...) { names->push_back("on_after_backward"); };
  h.on_before_optimizer_step = [names](auto&&...) { names->push_back("on_before_optimizer_step"); };
  h.on_validation_start = [names](auto&&...) { names->push_back("on_validation_start"); };
  h.on_validation_end = [names](auto&&...) { names->push_back("on_validation_end"); };
  h.on_validation_epoch_start = [names](auto&&...) { names->push_back("on_validation_epoch_start"); };
  h.on_validation_epoch_end = [names](auto&&...) { names->push_back("on_validation_epoch_end"); };
  h.on_validation_batch_start = [names](auto&&...) { names->push_back("on_validation_batch_start"); };
  h.on_validation_batch_end = [names](auto&&...) { names->push_back("on_validation_batch_end"); };
  h.on_test_start = [names](auto&&...) { names->push_back("on_test_start"); };
  h.on_test_end = [names](auto&&...) { names->push_back("on_test_end"); };
  h.on_test_epoch_start = [names](auto&&...) { names->push_back("on_test_epoch_start"); };
  h.on_test_epoch_end = [names](auto&&...) { names->push_back("on_test_epoch_end"); };
  h.on_test_batch_start = [names](auto&&...) { names->push_back("on_test_batch_start"); };
  h.on_test_batch_end = [names](auto&&...) { names->push_back("on_test_batch_end"); };
  h.on_predict_start = [names](auto&&...) { names->push_back("on_predict_start"); };
  h.on_predict_end = [names](auto&&...) { names->push_back("on_predict_end"); };
  h.on_predict_epoch_start = [names](auto&&...) { names->push_back("on_predict_epoch_start"); };
  h.on_predict_epoch_end = [names](auto&&...) { names->push_back("on_predict_epoch_end"); };
  h.on_predict_batch_start = [names](auto&&...) { names->push_back("on_predict_batch_start"); };
  h.on_predict_batch_end = [names](auto&&...) { names->push_back("on_predict_batch_end"); };
  h.on_save_checkpoint = [names](auto&&...) { names->push_back("on_save_checkpoint"); };
  h.on_load_checkpoint = [names](auto&&...) { names->push_back("on_load_checkpoint"); };
  h.on_exception = [names](auto&&...) { names->push_back("on_exception"); };
  return h;
}

// A training_step that throws at `fail_at` (a global step), once.
struct Failing : TinyNet {
  int64_t fail_at = -1;
  torch::Tensor training_step(torch::data::Example<> batch, int64_t i) override {
    if (fail_at >= 0 && trainer().global_step() == fail_at) throw std::runtime_error("failing on purpose");
    return TinyNet::training_step(batch, i);
  }
};

void run_every_stage(Trainer& trainer, TinyNet& model) {
  auto train = sequential_loader(8, 4);
  auto val = sequential_loader(4, 2);
  trainer.fit(model, train, val);
  trainer.validate(model, val);
  trainer.test(model, val);
  trainer.predict(model, val);
}

TEST(LambdaCallback, CallsEachHookWhereTheHookIsCalled) {
  TempDir dir;
  auto names = std::make_shared<std::vector<std::string>>();
  auto lambdas = std::make_shared<LambdaCallback>(recording_hooks(names));
  auto reference = std::make_shared<HookNames>();
  TinyNet a, b;
  {
    auto o = quiet(dir, 2, {lambdas});
    o.num_sanity_val_steps = 1;
    Trainer trainer(o);
    run_every_stage(trainer, a);
  }
  {
    auto o = quiet(dir, 2, {reference});
    o.num_sanity_val_steps = 1;
    Trainer trainer(o);
    run_every_stage(trainer, b);
  }
  EXPECT_EQ(*names, reference->names);
  EXPECT_GT(names->size(), 60u);
  // Failing runs reach on_exception; checkpoints reach the checkpoint hooks.
  Failing failing;
  failing.fail_at = 1;
  names->clear();
  Trainer trainer(quiet(dir, 1, {lambdas}));
  auto train = sequential_loader(8, 4);
  EXPECT_THROW(trainer.fit(failing, train), std::runtime_error);
  EXPECT_EQ(names->back(), "on_exception");
  trainer.save_checkpoint((dir.path / "a.ckpt").string());
  EXPECT_EQ(names->back(), "on_save_checkpoint");
}

TEST(LambdaCallback, EmptyHooksDoNothing) {
  TempDir dir;
  TinyNet model;
  Trainer trainer(quiet(dir, 1, {std::make_shared<LambdaCallback>(LambdaHooks{})}));
  run_every_stage(trainer, model);
  EXPECT_EQ(trainer.current_epoch(), 1);
}

TEST(OnExceptionCheckpoint, SavesWhenFitThrowsAndTheRunResumesFromIt) {
  TempDir dir;
  auto train = sequential_loader(16, 4);  // 4 steps an epoch
  auto saver = std::make_shared<OnExceptionCheckpoint>(dir.str());
  const auto path = (dir.path / "on_exception.ckpt").string();
  EXPECT_EQ(saver->ckpt_path(), path);
  Failing model;
  model.fail_at = 6;
  Trainer failing(quiet(dir, 3, {saver}));
  EXPECT_THROW(failing.fit(model, train), std::runtime_error);
  ASSERT_TRUE(std::filesystem::exists(path));

  // The checkpoint holds the state at the failing step: the run resumes there.
  Failing resumed;
  Trainer second(quiet(dir, 3, {saver}));
  auto result = second.fit(resumed, train, {.ckpt_path = path});
  EXPECT_EQ(result.global_step, 12);
  EXPECT_EQ(resumed.training_steps, 6);
  // A fit that ends normally removes the file, which would resume a finished run.
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(OnExceptionCheckpoint, IsACheckpointCallbackAndRefusesAnEmptyName) {
  TempDir dir;
  auto o = quiet(dir, 1, {std::make_shared<OnExceptionCheckpoint>(dir.str(), "crash")});
  o.enable_checkpointing = true;
  TinyNet model;
  Trainer trainer(o);
  auto train = sequential_loader(8, 4);
  trainer.fit(model, train);
  // As Lightning's Checkpoint callbacks, it replaces the default ModelCheckpoint.
  EXPECT_FALSE(std::filesystem::exists(dir.path / "checkpoints"));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path))
    EXPECT_NE(entry.path().extension(), ".ckpt") << entry.path();
  EXPECT_THROW(OnExceptionCheckpoint(dir.str(), ""), ConfigError);
}

}  // namespace
}  // namespace fulgor::testing
