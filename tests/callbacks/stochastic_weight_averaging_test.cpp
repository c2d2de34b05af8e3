// SWALR, update_bn and StochasticWeightAveraging, against
// torch.optim.swa_utils (swa_reference.py, run by python3-torch) and
// Lightning's StochasticWeightAveraging.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../support/python_reference.h"
#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

using Json = nlohmann::json;

const Json& swa_reference() {
  static const Json json = fulgor::test::python_reference(FULGOR_PYTHON_TORCH, FULGOR_SWA_REFERENCE, "swa");
  return json;
}

bool close(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(std::abs(a), std::abs(b)); }

// SGD over one scalar parameter per group, with the case's rates.
struct Groups {
  std::vector<torch::Tensor> params;
  std::unique_ptr<torch::optim::SGD> optimizer;
  explicit Groups(const std::vector<double>& lrs) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (double lr : lrs) {
      params.push_back(torch::zeros({1}, torch::requires_grad()));
      groups.emplace_back(std::vector<torch::Tensor>{params.back()}, std::make_unique<torch::optim::SGDOptions>(lr));
    }
    optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lrs[0]));
  }
};

TEST(SWALR, MatchesTorchsRates) {
  for (const auto& [name, c] : swa_reference().at("swalr").items()) {
    SCOPED_TRACE(name);
    Groups g(c.at("group_lrs").get<std::vector<double>>());
    SWALR scheduler(*g.optimizer, c.at("swa_lrs").get<std::vector<double>>(), c.at("anneal_epochs").get<int64_t>(),
                    c.at("strategy").get<std::string>());
    const auto& rows = c.at("lrs");
    for (size_t step = 0; step < rows.size(); ++step) {
      if (step > 0) scheduler.step();
      const auto lrs = scheduler.get_last_lr();
      for (size_t i = 0; i < lrs.size(); ++i)
        EXPECT_TRUE(close(lrs[i], rows[step][i].get<double>(), 1e-12))
            << "step " << step << " group " << i << ": " << lrs[i] << " vs torch's " << rows[step][i];
    }
  }
}

TEST(SWALR, RefusesWhatTorchRefuses) {
  Groups g({0.1, 0.2});
  EXPECT_THROW(SWALR(*g.optimizer, {0.1, 0.2, 0.3}), ConfigError);
  EXPECT_THROW(SWALR(*g.optimizer, {0.1}, 10, "step"), ConfigError);
  EXPECT_THROW(SWALR(*g.optimizer, {0.1}, -1), ConfigError);
}

// swa_reference.py's Net.
struct BnNet : torch::nn::Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  torch::nn::BatchNorm1d bn1{nullptr}, bn2{nullptr};
  BnNet() {
    l1 = register_module("l1", torch::nn::Linear(3, 4));
    bn1 = register_module("bn1", torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(4).momentum(0.3)));
    l2 = register_module("l2", torch::nn::Linear(4, 2));
    bn2 = register_module("bn2", torch::nn::BatchNorm1d(2));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn2(l2(torch::relu(bn1(l1(x))))); }
};

torch::Tensor reference_batch(int64_t b, int64_t rows) {
  auto x = torch::empty({rows, 3}, torch::kDouble);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 3; ++c) x[r][c] = 2 * std::cos(0.3 * b + 0.7 * r + 1.1 * c) + 0.5;
  return x.to(torch::kFloat);
}

TEST(UpdateBn, MatchesTorchsStatistics) {
  const auto& ref = swa_reference().at("update_bn");
  BnNet net;
  {
    torch::NoGradGuard no_grad;
    int64_t j = 0;
    for (auto& p : net.parameters()) {
      auto values = torch::empty({p.numel()}, torch::kDouble);
      for (int64_t e = 0; e < p.numel(); ++e) values[e] = std::sin(0.37 * j + 0.11 * e);
      p.copy_(values.reshape(p.sizes()));
      ++j;
    }
    for (auto* bn : {net.bn1.get(), net.bn2.get()}) {
      bn->running_mean.fill_(7.0);
      bn->running_var.fill_(3.0);
      bn->num_batches_tracked.fill_(11);
    }
  }
  net.eval();
  const std::vector<int64_t> rows{5, 4, 3};
  EXPECT_TRUE(update_bn(net, [&] {
    for (size_t b = 0; b < rows.size(); ++b) net.forward(reference_batch(static_cast<int64_t>(b), rows[b]));
  }));
  EXPECT_EQ(net.is_training(), ref.at("training").get<bool>());
  EXPECT_DOUBLE_EQ(*net.bn1->options.momentum(), ref.at("momenta")[0].get<double>());
  EXPECT_DOUBLE_EQ(*net.bn2->options.momentum(), ref.at("momenta")[1].get<double>());
  const std::vector<torch::nn::BatchNorm1dImpl*> bns{net.bn1.get(), net.bn2.get()};
  for (size_t k = 0; k < bns.size(); ++k) {
    const auto& r = ref.at("bn")[k];
    EXPECT_EQ(bns[k]->num_batches_tracked.item<int64_t>(), r.at("num_batches_tracked").get<int64_t>());
    for (const char* stat : {"running_mean", "running_var"}) {
      const auto mine =
          (std::string(stat) == "running_mean" ? bns[k]->running_mean : bns[k]->running_var).to(torch::kDouble);
      const auto theirs = r.at(stat).get<std::vector<double>>();
      for (size_t i = 0; i < theirs.size(); ++i)
        EXPECT_TRUE(close(mine[static_cast<int64_t>(i)].item<double>(), theirs[i], 1e-6))
            << "bn" << k + 1 << "." << stat << "[" << i << "]";
    }
  }
  torch::nn::Linear plain(2, 2);
  EXPECT_FALSE(update_bn(*plain, [] { FAIL() << "a model without batch norm runs no pass"; }));
}

// What the module's weights and rate were at each epoch, seen before SWA acts.
struct EpochRecorder : Callback {
  std::vector<std::vector<torch::Tensor>> start_weights;
  std::vector<double> lrs;
  void on_train_epoch_start(Trainer&, ModuleBase& module) override {
    std::vector<torch::Tensor> copy;
    for (const auto& p : module.parameters()) copy.push_back(p.detach().clone());
    start_weights.push_back(copy);
  }
  void on_train_epoch_end(Trainer& trainer, ModuleBase&) override {
    lrs.push_back(trainer.optimizers().front()->param_groups()[0].options().get_lr());
  }
};

StochasticWeightAveragingOptions swa_options() {
  StochasticWeightAveragingOptions o;
  o.swa_lrs = {0.05};
  o.swa_epoch_start = 0.5;  // of 6 epochs: the 3rd, index 2
  o.annealing_epochs = 2;
  o.annealing_strategy = "cos";
  return o;
}

TEST(StochasticWeightAveraging, AveragesFromTheStartEpochWithSwalrAndEndsOnTheAverage) {
  TempDir dir;
  auto recorder = std::make_shared<EpochRecorder>();
  auto swa = std::make_shared<StochasticWeightAveraging>(swa_options());
  torch::manual_seed(1);
  TinyNet model;
  Trainer trainer(quiet(dir, 6, {recorder, swa}));
  auto train = sequential_loader(12, 4);
  trainer.fit(model, train);
  EXPECT_EQ(swa->swa_start(), 2);
  EXPECT_EQ(swa->n_averaged(), 4);
  // The module ends on the mean of its weights at the starts of epochs 2 to 5.
  const auto parameters = model.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    auto mean = torch::zeros_like(parameters[i]);
    for (int e = 2; e < 6; ++e) mean += recorder->start_weights[e][i];
    mean /= 4;
    EXPECT_TRUE(torch::allclose(parameters[i], mean, 1e-5, 1e-7)) << "parameter " << i;
  }
  // The rates: the optimizer's before SWA, then SWALR's as Lightning builds it.
  const auto& torch_lrs = swa_reference().at("swalr").at("lightning_cos").at("lrs");
  ASSERT_EQ(recorder->lrs.size(), 6u);
  EXPECT_EQ(recorder->lrs[0], 0.1);
  EXPECT_EQ(recorder->lrs[1], 0.1);
  for (size_t e = 2; e < 6; ++e)
    EXPECT_TRUE(close(recorder->lrs[e], torch_lrs[e - 2][0].get<double>(), 1e-12)) << "epoch " << e;
}

// A TinyNet whose training_step throws at one global step, once.
struct FailingOnce : TinyNet {
  int64_t fail_at = -1;
  torch::Tensor training_step(torch::data::Example<> batch, int64_t i) override {
    if (trainer().global_step() == fail_at) {
      fail_at = -1;
      throw std::runtime_error("failing on purpose");
    }
    return TinyNet::training_step(batch, i);
  }
};

TEST(StochasticWeightAveraging, ResumesExactlyFromACheckpoint) {
  TempDir dir;
  auto train = sequential_loader(12, 4);
  torch::manual_seed(1);
  FailingOnce straight;
  {
    Trainer trainer(quiet(dir, 6, {std::make_shared<StochasticWeightAveraging>(swa_options())}));
    trainer.fit(straight, train);
  }
  torch::manual_seed(1);
  FailingOnce failing;
  failing.fail_at = 13;  // in epoch 4, averaging under way
  auto saver = std::make_shared<OnExceptionCheckpoint>(dir.str());
  {
    Trainer trainer(quiet(dir, 6, {std::make_shared<StochasticWeightAveraging>(swa_options()), saver}));
    EXPECT_THROW(trainer.fit(failing, train), std::runtime_error);
  }
  torch::manual_seed(7);
  FailingOnce resumed;
  auto swa = std::make_shared<StochasticWeightAveraging>(swa_options());
  auto recorder = std::make_shared<EpochRecorder>();
  Trainer trainer(quiet(dir, 6, {recorder, swa, saver}));
  trainer.fit(resumed, train, {.ckpt_path = saver->ckpt_path()});
  // The resumed epoch 4 runs at SWALR's rate, as epoch 5 does.
  EXPECT_EQ(recorder->lrs.size(), 2u);
  EXPECT_EQ(swa->n_averaged(), 4);
  EXPECT_TRUE(same_parameters(resumed, straight));

  for (double lr : recorder->lrs)
    EXPECT_EQ(lr, swa_reference().at("swalr").at("lightning_cos").at("lrs")[3][0].get<double>());
}

// A regression net with a batch-norm layer, and the pass over its training data.
struct BnRegression : Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  BnRegression() {
    l1 = register_module("l1", torch::nn::Linear(4, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    l2 = register_module("l2", torch::nn::Linear(8, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return l2(torch::tanh(bn(l1(x)))); }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::mse_loss(forward(batch.data), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
};

TEST(StochasticWeightAveraging, RecomputesBatchNormStatisticsForTheAverage) {
  TempDir dir;
  XY data(12, 7);
  auto pass = [&](ModuleBase& module) {
    auto& net = static_cast<BnRegression&>(module);
    for (int64_t start = 0; start < 12; start += 4) net.forward(data.x.narrow(0, start, 4));
  };
  auto options = swa_options();
  options.bn_forward = pass;
  BnRegression model;
  Trainer trainer(quiet(dir, 6, {std::make_shared<StochasticWeightAveraging>(options)}));
  auto train = sequential_loader(12, 4, 7);
  trainer.fit(model, train);
  EXPECT_EQ(model.bn->num_batches_tracked.item<int64_t>(), 3);
  // The statistics are those of the final (averaged) weights: a second pass gives the same.
  const auto mean = model.bn->running_mean.clone(), var = model.bn->running_var.clone();
  update_bn(model, [&] { pass(model); });
  EXPECT_TRUE(torch::allclose(model.bn->running_mean, mean, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(model.bn->running_var, var, 1e-6, 1e-7));

  BnRegression without_pass;
  Trainer refusing(quiet(dir, 6, {std::make_shared<StochasticWeightAveraging>(swa_options())}));
  EXPECT_THROW(refusing.fit(without_pass, train), ConfigError);
}

TEST(StochasticWeightAveraging, RefusesWhatLightningRefusesAndAModuleScheduler) {
  auto with = [](auto change) {
    auto o = swa_options();
    change(o);
    return o;
  };
  EXPECT_THROW(StochasticWeightAveraging(with([](auto& o) { o.swa_lrs = {}; })), ConfigError);
  EXPECT_THROW(StochasticWeightAveraging(with([](auto& o) { o.swa_lrs = {0.1, -0.1}; })), ConfigError);
  EXPECT_THROW(StochasticWeightAveraging(with([](auto& o) { o.swa_epoch_start = int64_t{0}; })), ConfigError);
  EXPECT_THROW(StochasticWeightAveraging(with([](auto& o) { o.swa_epoch_start = 1.5; })), ConfigError);
  EXPECT_THROW(StochasticWeightAveraging(with([](auto& o) { o.annealing_strategy = "step"; })), ConfigError);
  EXPECT_THROW(StochasticWeightAveraging(with([](auto& o) { o.annealing_epochs = -1; })), ConfigError);
  TempDir dir;
  auto train = sequential_loader(8, 4);
  auto model = adam_step_lr_net(1, 0.0);
  Trainer trainer(quiet(dir, 2, {std::make_shared<StochasticWeightAveraging>(swa_options())}));
  EXPECT_THROW(trainer.fit(*model, train), ConfigError);
  TinyNet unlimited;
  auto o = quiet(dir, -1, {std::make_shared<StochasticWeightAveraging>(swa_options())});
  o.max_steps = 4;
  Trainer endless(o);
  EXPECT_THROW(endless.fit(unlimited, train), ConfigError);
}

}  // namespace
}  // namespace fulgor::testing
