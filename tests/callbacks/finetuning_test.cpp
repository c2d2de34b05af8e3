// BaseFinetuning and BackboneFinetuning, as Lightning's: the backbone frozen,
// then trained in a new parameter group whose rate Lightning's rule sets,
// and a resume that adds the group again and continues exactly.

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

// Lightning's example: a backbone, and a head that the optimizer alone trains.
struct BackboneNet : Module {
  torch::nn::Sequential backbone{nullptr};
  torch::nn::Linear head{nullptr};
  BackboneNet() {
    backbone = register_module(
        "backbone", torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::Tanh()));
    head = register_module("head", torch::nn::Linear(8, 1));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::mse_loss(head(backbone->forward(batch.data)), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(head->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
};

// Per epoch, at its first batch: the groups' rates and whether the backbone trains.
struct GroupLog : Callback {
  std::vector<std::vector<double>> lrs;
  std::vector<bool> backbone_trains;
  void on_train_batch_start(Trainer& t, ModuleBase& m, int64_t batch_idx) override {
    if (batch_idx != 0) return;
    std::vector<double> v;
    for (const auto& g : t.optimizers()[0]->param_groups()) v.push_back(g.options().get_lr());
    lrs.push_back(v);
    backbone_trains.push_back(dynamic_cast<BackboneNet&>(m).backbone->parameters()[0].requires_grad());
  }
};

TEST(BackboneFinetuning, UnfreezesIntoANewGroupAndGrowsItsRateAsLightning) {
  TempDir dir;
  auto train = sequential_loader(32, 8);
  torch::manual_seed(1);
  BackboneNet net;
  const auto backbone_before = net.backbone->parameters()[0].clone();
  auto log = std::make_shared<GroupLog>();
  auto finetuning = std::make_shared<BackboneFinetuning>(
      BackboneFinetuningOptions{.unfreeze_backbone_at_epoch = 1, .backbone_initial_ratio_lr = 0.3});
  Trainer trainer(quiet(dir, 5, {finetuning, log}));
  trainer.fit(net, train);
  // Lightning's rule: 0.1 * 0.3 at epoch 1, doubled (lambda_func's default)
  // at each later epoch, aligned with the head's 0.1 once it would pass it.
  const std::vector<std::vector<double>> expected{
      {0.1}, {0.1, 0.1 * 0.3}, {0.1, 2 * 0.1 * 0.3}, {0.1, 0.1}, {0.1, 0.1}};
  ASSERT_EQ(log->lrs.size(), expected.size());
  for (size_t e = 0; e < expected.size(); ++e) {
    ASSERT_EQ(log->lrs[e].size(), expected[e].size()) << "epoch " << e;
    for (size_t g = 0; g < expected[e].size(); ++g) EXPECT_DOUBLE_EQ(log->lrs[e][g], expected[e][g]) << "epoch " << e;
  }
  EXPECT_EQ(log->backbone_trains, (std::vector<bool>{false, true, true, true, true}));
  EXPECT_FALSE(torch::equal(net.backbone->parameters()[0], backbone_before));
  // The BatchNorm layer trains throughout (train_bn), the Linear did not at first.
  EXPECT_TRUE(net.backbone->parameters()[2].requires_grad());
}

TEST(BackboneFinetuning, FrozenBackboneDoesNotMoveAndRefusesAModuleWithoutOne) {
  TempDir dir;
  auto train = sequential_loader(32, 8);
  BackboneNet net;
  const auto before = net.backbone->parameters();
  std::vector<torch::Tensor> copies;
  for (const auto& p : before) copies.push_back(p.clone());
  auto finetuning = std::make_shared<BackboneFinetuning>(
      BackboneFinetuningOptions{.unfreeze_backbone_at_epoch = 5, .train_bn = false});
  Trainer trainer(quiet(dir, 2, {finetuning}));
  trainer.fit(net, train);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], copies[i])) << i;
  auto* bn = net.backbone[1]->as<torch::nn::BatchNorm1d>();
  // As Lightning's, freeze_before_training leaves BatchNorm trainable;
  // train_bn = false only keeps it out of the group added when unfreezing.
  EXPECT_TRUE(bn->options.track_running_stats());

  TinyNet no_backbone;
  Trainer refusing(quiet(dir, 1, {std::make_shared<BackboneFinetuning>()}));
  EXPECT_THROW(refusing.fit(no_backbone, train), ConfigError);
}

TEST(BaseFinetuning, HelpersFollowLightning) {
  BackboneNet net;
  EXPECT_EQ(BaseFinetuning::flatten_modules(net).size(), 4u);  // Linear, BatchNorm1d, Tanh, head
  BaseFinetuning::freeze(*net.backbone, /*train_bn=*/false);
  EXPECT_TRUE(BaseFinetuning::filter_params(*net.backbone).empty());
  EXPECT_FALSE(net.backbone[1]->as<torch::nn::BatchNorm1d>()->options.track_running_stats());
  EXPECT_EQ(BaseFinetuning::filter_params(*net.backbone, true, false).size(), 4u);
  torch::optim::SGD sgd(net.head->parameters(), torch::optim::SGDOptions(0.2));
  BaseFinetuning::unfreeze_and_add_param_group(*net.backbone, sgd);
  ASSERT_EQ(sgd.param_groups().size(), 2u);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[1].options().get_lr(), 0.2 / 10);
  EXPECT_EQ(sgd.param_groups()[1].params().size(), 4u);
  // Nothing left to add: no third group.
  BaseFinetuning::unfreeze_and_add_param_group(*net.backbone, sgd, 0.5);
  EXPECT_EQ(sgd.param_groups().size(), 2u);
}

// 4 epochs straight, and 2 then 2 more from the checkpoint of epoch 1 (the
// group added at epoch 1), end with the same weights.
TEST(BackboneFinetuning, ResumeAddsTheGroupAgainAndContinuesExactly) {
  TempDir dir;
  auto train = sequential_loader(32, 8);
  auto options = [] {
    return BackboneFinetuningOptions{.unfreeze_backbone_at_epoch = 1,
                                     .lambda_func = [](int64_t) { return 1.5; },
                                     .backbone_initial_lr = 0.01,
                                     .should_align = false};
  };
  torch::manual_seed(2);
  BackboneNet straight;
  Trainer whole(quiet(dir, 4, {std::make_shared<BackboneFinetuning>(options())}));
  whole.fit(straight, train);

  torch::manual_seed(2);
  BackboneNet first;
  auto saver = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.dirpath = dir.str(), .save_top_k = -1});
  auto half_options = quiet(dir, 2, {std::make_shared<BackboneFinetuning>(options()), saver});
  half_options.enable_checkpointing = true;
  Trainer half(half_options);
  half.fit(first, train);
  const std::string path = (dir.path / "epoch=1-step=8.ckpt").string();
  ASSERT_TRUE(std::filesystem::exists(path));

  BackboneNet resumed;
  auto finetuning = std::make_shared<BackboneFinetuning>(options());
  auto log = std::make_shared<GroupLog>();
  Trainer rest(quiet(dir, 4, {finetuning, log}));
  rest.fit(resumed, train, {.ckpt_path = path});
  ASSERT_EQ(log->lrs.size(), 2u);
  EXPECT_EQ(log->lrs[0].size(), 2u);
  EXPECT_DOUBLE_EQ(log->lrs[1][1], 0.01 * 1.5 * 1.5);
  EXPECT_TRUE(same_parameters(straight, resumed));
}

}  // namespace
}  // namespace fulgor::testing
