// AveragedModel against torch.optim.swa_utils' (weight_averaging_reference.py,
// run by Debian's python3-torch), and WeightAveraging / EMAWeightAveraging in
// fit as Lightning's: when they update, validation on the average, the
// average in checkpoints, and a resume that continues exactly.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../support/python_reference.h"
#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

using Json = nlohmann::json;

// weight_averaging_reference.py's Net.
struct AveragingNet : torch::nn::Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  torch::Tensor running;
  AveragingNet() {
    l1 = register_module("l1", torch::nn::Linear(3, 4));
    l2 = register_module("l2", torch::nn::Linear(4, 2));
    running = register_buffer("running", torch::zeros({4}));
    to(torch::kDouble);
  }
  std::vector<torch::Tensor> all() const {
    auto t = parameters();
    for (const auto& b : buffers()) t.push_back(b);
    return t;
  }
};

// The reference's weights after update k.
void set_weights(AveragingNet& net, int64_t k) {
  torch::NoGradGuard no_grad;
  const auto all = net.all();
  for (size_t j = 0; j < all.size(); ++j) {
    std::vector<double> values;
    for (int64_t e = 0; e < all[j].numel(); ++e)
      values.push_back(std::sin(0.37 * static_cast<double>(k) + 0.11 * static_cast<double>(e) + 0.7 * j) *
                       (1 + 0.01 * static_cast<double>(k)));
    all[j].copy_(torch::tensor(values, torch::kDouble).reshape(all[j].sizes()));
  }
}

const Json& averaging_reference() {
  static const Json json =
      fulgor::test::python_reference(FULGOR_PYTHON_TORCH, FULGOR_AVERAGING_REFERENCE, "averaging");
  return json;
}

// torch averages with foreach lerp where fulgor writes the formula out: the
// last bits may differ.
bool near(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)) + 1e-15; }

void expect_reference(const std::string& name, AverageFunction average) {
  const auto& ref = averaging_reference();
  const auto& c = ref.at("cases").at(name);
  if (c.contains("skipped")) GTEST_SKIP() << c.at("skipped").get<std::string>();
  const auto& rows = c.at("rows");
  AveragingNet net;
  AveragedModel averaged(net, std::move(average));
  for (size_t k = 0; k < rows.size(); ++k) {
    set_weights(net, static_cast<int64_t>(k));
    averaged.update_parameters(net);
    std::vector<double> got;
    for (const auto& t : averaged.tensors())
      for (int64_t e = 0; e < t.numel(); ++e) got.push_back(t.flatten()[e].item<double>());
    const auto want = rows[k].get<std::vector<double>>();
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_TRUE(near(want[i], got[i])) << name << " (torch " << ref.at("torch") << ") value " << i << " after "
                                         << k + 1 << " updates: torch " << fmt::format("{:.17g}", want[i])
                                         << ", fulgor " << fmt::format("{:.17g}", got[i]);
  }
  EXPECT_EQ(averaged.n_averaged(), static_cast<int64_t>(rows.size()));
}

TEST(AveragedModel, EqualAverageMatchesTorch) { expect_reference("swa", swa_average()); }
TEST(AveragedModel, EmaMatchesTorchsEmaAvgFn) {
  expect_reference("ema", ema_average(averaging_reference().at("decay").get<double>()));
}
TEST(AveragedModel, EmaMatchesTorchsEmaMultiAvgFn) {
  expect_reference("ema_multi", ema_average(averaging_reference().at("decay").get<double>()));
}

TEST(AveragedModel, WithoutBuffersCopiesThemAndRefusesAnotherModule) {
  AveragingNet net;
  AveragedModel averaged(net, swa_average(), /*use_buffers=*/false);
  set_weights(net, 0);
  averaged.update_parameters(net);
  set_weights(net, 1);
  const auto first = averaged.tensors()[0].clone();
  averaged.update_parameters(net);
  EXPECT_TRUE(torch::allclose(averaged.tensors()[0], (first + net.all()[0]) / 2));
  EXPECT_TRUE(torch::equal(averaged.tensors().back(), net.running));  // the buffer copied, not averaged
  torch::nn::Linear other(3, 4);
  EXPECT_THROW(averaged.update_parameters(*other), ConfigError);
  EXPECT_THROW(ema_average(1.5), ConfigError);
}

// The module's parameters after every optimizer step, and what validation saw.
struct WeightLog : Callback {
  std::vector<std::vector<torch::Tensor>> steps;
  std::vector<std::vector<torch::Tensor>> validated;
  static std::vector<torch::Tensor> copy(ModuleBase& m) {
    std::vector<torch::Tensor> v;
    for (const auto& p : m.parameters()) v.push_back(p.detach().clone());
    return v;
  }
  void on_train_batch_end(Trainer&, ModuleBase& m, const torch::Tensor&, int64_t) override { steps.push_back(copy(m)); }
  void on_validation_epoch_start(Trainer&, ModuleBase& m) override { validated.push_back(copy(m)); }
};

// The exponential average of the logged steps whose index `updates` accepts.
std::vector<torch::Tensor> ema_of(
    const std::vector<std::vector<torch::Tensor>>& steps, double decay, size_t count,
    const std::function<bool(size_t)>& updates = [](size_t) { return true; }) {
  std::vector<torch::Tensor> average;
  for (size_t k = 0; k < count; ++k) {
    if (!updates(k)) continue;
    if (average.empty()) {
      for (const auto& t : steps[k]) average.push_back(t.clone());
      continue;
    }
    for (size_t i = 0; i < average.size(); ++i) average[i] = decay * average[i] + (1 - decay) * steps[k][i];
  }
  return average;
}

void expect_parameters(ModuleBase& m, const std::vector<torch::Tensor>& expected, const std::string& what) {
  const auto p = m.parameters();
  ASSERT_EQ(p.size(), expected.size()) << what;
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_TRUE(torch::allclose(p[i], expected[i], 1e-5, 1e-6)) << what << ": parameter " << i;
}

TEST(EMAWeightAveraging, AveragesEveryStepValidatesOnTheAverageAndEndsWithIt) {
  TempDir dir;
  auto train = sequential_loader(32, 4);  // 8 steps an epoch
  auto val = sequential_loader(8, 4, 11);
  torch::manual_seed(5);
  TinyNet net;
  auto ema = std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions{.decay = 0.7});
  auto log = std::make_shared<WeightLog>();
  Trainer trainer(quiet(dir, 2, {ema, log}));
  trainer.fit(net, train, val);
  ASSERT_EQ(log->steps.size(), 16u);
  EXPECT_EQ(ema->average_model()->n_averaged(), 16);
  ASSERT_EQ(log->validated.size(), 2u);
  // Validation after the first epoch saw the average of its 8 steps; the
  // module trained on from its own weights, swapped back.
  const auto after_epoch0 = ema_of(log->steps, 0.7, 8);
  for (size_t i = 0; i < after_epoch0.size(); ++i)
    EXPECT_TRUE(torch::allclose(log->validated[0][i], after_epoch0[i], 1e-5, 1e-6)) << "parameter " << i;
  EXPECT_FALSE(torch::allclose(log->steps[7][0], after_epoch0[0]));
  expect_parameters(net, ema_of(log->steps, 0.7, 16), "after fit");
}

TEST(EMAWeightAveraging, UpdatesFromTheStartingStepEveryNSteps) {
  TempDir dir;
  auto train = sequential_loader(32, 4);
  torch::manual_seed(6);
  TinyNet net;
  auto ema = std::make_shared<EMAWeightAveraging>(
      EMAWeightAveragingOptions{.decay = 0.5, .update_every_n_steps = 2, .update_starting_at_step = 3});
  auto log = std::make_shared<WeightLog>();
  auto options = quiet(dir, 2, {ema, log});
  options.accumulate_grad_batches = 2;  // 4 optimizer steps an epoch; batches 1, 3, ... step
  Trainer trainer(options);
  trainer.fit(net, train);
  // Steps 0..7 (batches 1, 3, ..., 15): those of index >= 3 and even, 4 and 6.
  EXPECT_EQ(ema->average_model()->n_averaged(), 2);
  expect_parameters(net, ema_of(log->steps, 0.5, 16, [](size_t k) { return k == 9 || k == 13; }), "after fit");
  // Lightning's rule, alone.
  EMAWeightAveraging by_epoch({.update_every_n_steps = 0, .update_starting_at_epoch = 1});
  EXPECT_FALSE(by_epoch.should_update(4, std::nullopt));
  EXPECT_FALSE(by_epoch.should_update(std::nullopt, 0));
  EXPECT_TRUE(by_epoch.should_update(std::nullopt, 1));
}

// A fit of 4 epochs, and one stopped after 2 and resumed from its checkpoint
// with a new callback, end with the same weights; the checkpoint's model is
// the average, which load_module_weights reads; whether the ModelCheckpoint
// saves synchronously (the default) or asynchronously.
TEST(EMAWeightAveraging, CheckpointHoldsTheAverageAndResumesExactly) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async_checkpointing" : "synchronous saves");
    TempDir dir;
    auto train = sequential_loader(32, 4);
    torch::manual_seed(8);
    TinyNet straight;
    Trainer whole(quiet(dir, 4, {std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions{.decay = 0.8})}));
    whole.fit(straight, train);

    torch::manual_seed(8);
    TinyNet first;
    auto first_ema = std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions{.decay = 0.8});
    auto log = std::make_shared<WeightLog>();
    auto saver = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.dirpath = dir.str(), .save_top_k = -1});
    auto options = quiet(dir, 2, {first_ema, log, saver});
    options.enable_checkpointing = true;
    options.async_checkpointing = async;
    Trainer half(options);
    half.fit(first, train);
    const std::string path = (dir.path / "epoch=1-step=16.ckpt").string();
    ASSERT_TRUE(std::filesystem::exists(path));
    TinyNet from_file;
    load_module_weights(from_file, path);
    expect_parameters(from_file, ema_of(log->steps, 0.8, 16), "the checkpoint's model");
    // validate() from the first epoch's checkpoint runs on its average, not on
    // the average this callback kept from the fit.
    auto val = sequential_loader(8, 4, 11);
    half.validate(first, val, {.ckpt_path = (dir.path / "epoch=0-step=8.ckpt").string()});
    ASSERT_EQ(log->validated.size(), 1u);
    const auto after_epoch0 = ema_of(log->steps, 0.8, 8);
    for (size_t i = 0; i < after_epoch0.size(); ++i)
      EXPECT_TRUE(torch::allclose(log->validated[0][i], after_epoch0[i], 1e-5, 1e-6)) << "parameter " << i;

    TinyNet resumed;
    Trainer rest(quiet(dir, 4, {std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions{.decay = 0.8})}));
    rest.fit(resumed, train, {.ckpt_path = path});
    EXPECT_TRUE(same_parameters(straight, resumed));
  }
}

}  // namespace
}  // namespace fulgor::testing
