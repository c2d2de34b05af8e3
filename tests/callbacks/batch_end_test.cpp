// The batch-end hooks' batch and outputs (BatchEnd), as Lightning's
// on_*_batch_end(trainer, module, outputs, batch, batch_idx, dataloader_idx).

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

using Example = torch::data::Example<>;

// What each step was given and returned, by stage.
struct Seen {
  torch::Tensor data, outputs;
  int64_t batch_idx = -1;
};

struct RecordingSteps : TinyNet {
  std::map<std::string, std::vector<Seen>> steps;
  torch::Tensor training_step(Example batch, int64_t i) override {
    auto loss = TinyNet::training_step(batch, i);
    steps["train"].push_back({batch.data, loss.detach(), i});
    return loss;
  }
  void validation_step(Example batch, int64_t i) override {
    steps["validation"].push_back({batch.data, {}, i});
    TinyNet::validation_step(batch, i);
  }
  void test_step(Example batch, int64_t i) override {
    steps["test"].push_back({batch.data, {}, i});
    TinyNet::test_step(batch, i);
  }
  torch::Tensor predict_step(Example batch, int64_t i) override {
    auto out = TinyNet::predict_step(batch, i);
    steps["predict"].push_back({batch.data, out, i});
    return out;
  }
};

struct BatchEndRecorder : Callback {
  std::map<std::string, std::vector<Seen>> ends;
  void record(const std::string& stage, const BatchEnd& end) {
    EXPECT_EQ(end.dataloader_idx, 0);
    ASSERT_TRUE(end.has_batch());
    ends[stage].push_back({end.batch<Example>().data, end.outputs, end.batch_idx});
  }
  void on_train_batch_end(Trainer&, ModuleBase&, const BatchEnd& end) override { record("train", end); }
  void on_validation_batch_end(Trainer&, ModuleBase&, const BatchEnd& end) override { record("validation", end); }
  void on_test_batch_end(Trainer&, ModuleBase&, const BatchEnd& end) override { record("test", end); }
  void on_predict_batch_end(Trainer&, ModuleBase&, const BatchEnd& end) override { record("predict", end); }
};

// The shorter forms, as callbacks written before BatchEnd override them.
struct ShortFormCounter : Callback {
  std::map<std::string, std::vector<int64_t>> indices;
  std::vector<double> losses;
  void on_train_batch_end(Trainer&, ModuleBase&, const torch::Tensor& loss, int64_t i) override {
    indices["train"].push_back(i);
    losses.push_back(loss.item<double>());
  }
  void on_validation_batch_end(Trainer&, ModuleBase&, int64_t i) override { indices["validation"].push_back(i); }
  void on_test_batch_end(Trainer&, ModuleBase&, int64_t i) override { indices["test"].push_back(i); }
  void on_predict_batch_end(Trainer&, ModuleBase&, int64_t i) override { indices["predict"].push_back(i); }
};

void run_all_stages(Trainer& trainer, ModuleBase& model) {
  auto train = sequential_loader(12, 4);
  auto val = sequential_loader(6, 2);
  auto& m = static_cast<RecordingSteps&>(model);
  trainer.fit(m, train, val);
  trainer.validate(m, val);
  trainer.test(m, val);
  trainer.predict(m, val);
}

void expect_same_steps(const std::vector<Seen>& steps, const std::vector<Seen>& ends, const std::string& stage) {
  ASSERT_EQ(steps.size(), ends.size()) << stage;
  for (size_t k = 0; k < steps.size(); ++k) {
    SCOPED_TRACE(stage + " batch " + std::to_string(k));
    EXPECT_EQ(ends[k].batch_idx, steps[k].batch_idx);
    // The very tensors the step was given, not equal copies.
    EXPECT_TRUE(ends[k].data.is_same(steps[k].data));
    EXPECT_EQ(ends[k].outputs.defined(), steps[k].outputs.defined());
    if (steps[k].outputs.defined()) {
      EXPECT_TRUE(torch::equal(ends[k].outputs, steps[k].outputs));
    }
    if (stage == "predict") {
      EXPECT_TRUE(ends[k].outputs.is_same(steps[k].outputs));
    }
    if (stage == "train") {
      EXPECT_FALSE(ends[k].outputs.requires_grad());
    }
  }
}

TEST(BatchEnd, HooksSeeEachStepsBatchAndOutputs) {
  TempDir dir;
  auto recorder = std::make_shared<BatchEndRecorder>();
  auto short_form = std::make_shared<ShortFormCounter>();
  RecordingSteps model;
  Trainer trainer(quiet(dir, 2, {recorder, short_form}));
  run_all_stages(trainer, model);
  for (const char* stage : {"train", "validation", "test", "predict"}) {
    ASSERT_FALSE(model.steps[stage].empty()) << stage;
    expect_same_steps(model.steps[stage], recorder->ends[stage], stage);
    // The shorter forms are still called, once per step, with the same indices.
    std::vector<int64_t> expected;
    for (const auto& s : model.steps[stage]) expected.push_back(s.batch_idx);
    EXPECT_EQ(short_form->indices[stage], expected) << stage;
  }
  ASSERT_EQ(short_form->losses.size(), model.steps["train"].size());
  for (size_t k = 0; k < short_form->losses.size(); ++k)
    EXPECT_DOUBLE_EQ(short_form->losses[k], model.steps["train"][k].outputs.item<double>());
}

TEST(BatchEnd, LambdaCallbackTakesEitherForm) {
  TempDir dir;
  std::map<std::string, std::vector<Seen>> full;
  std::vector<int64_t> short_train, short_predict;
  LambdaHooks hooks;
  hooks.on_train_batch_end = [&](Trainer&, ModuleBase&, const BatchEnd& end) {
    full["train"].push_back({end.batch<Example>().data, end.outputs, end.batch_idx});
  };
  hooks.on_predict_batch_end = [&](Trainer&, ModuleBase&, const BatchEnd& end) {
    full["predict"].push_back({end.batch<Example>().data, end.outputs, end.batch_idx});
  };
  LambdaHooks short_hooks;
  short_hooks.on_train_batch_end = [&](Trainer&, ModuleBase&, const torch::Tensor&, int64_t i) {
    short_train.push_back(i);
  };
  short_hooks.on_predict_batch_end = [&](Trainer&, ModuleBase&, int64_t i) { short_predict.push_back(i); };
  RecordingSteps model;
  Trainer trainer(
      quiet(dir, 1, {std::make_shared<LambdaCallback>(hooks), std::make_shared<LambdaCallback>(short_hooks)}));
  run_all_stages(trainer, model);
  expect_same_steps(model.steps["train"], full["train"], "train");
  expect_same_steps(model.steps["predict"], full["predict"], "predict");
  EXPECT_EQ(short_train, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(short_predict, (std::vector<int64_t>{0, 1, 2}));
}

TEST(BatchEnd, AskingForAnotherBatchTypeNamesBoth) {
  TempDir dir;
  std::string message;
  LambdaHooks hooks;
  hooks.on_predict_batch_end = [&](Trainer&, ModuleBase&, const BatchEnd& end) {
    try {
      end.batch<torch::Tensor>();
    } catch (const Error& e) {
      message = e.what();
    }
  };
  RecordingSteps model;
  Trainer trainer(quiet(dir, 1, {std::make_shared<LambdaCallback>(hooks)}));
  auto loader = sequential_loader(4, 2);
  trainer.predict(model, loader);
  EXPECT_NE(message.find("BatchEnd::batch<at::Tensor>()"), std::string::npos) << message;
  EXPECT_NE(message.find("torch::data::Example<at::Tensor, at::Tensor>"), std::string::npos) << message;
}

}  // namespace
}  // namespace fulgor::testing
