// SyncBatchNorm and convert_sync_batchnorm: in one process (where it is a
// BatchNorm), on two ranks through gloo against one process holding both
// ranks' samples, and the Trainer's sync_batchnorm under ddp.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/distributed/sync_batchnorm.h"
#include "support/ddp_trainer_scenario.h"
#include "support/scenarios.h"
#include "support/spawn.h"

namespace {

using namespace fulgor::test;

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double tolerance,
                  const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(torch::allclose(actual, expected, tolerance, tolerance))
      << what << ": max difference " << (actual - expected).abs().max().item<double>();
}

// Runs `layer` as BatchNorm and as its SyncBatchNorm copy side by side, in
// training then evaluation mode: one process, no group, so the same results.
void expect_same_as_batchnorm(const torch::nn::BatchNormOptions& options, torch::Tensor x) {
  torch::nn::Sequential plain{torch::nn::BatchNorm2d(options)};
  torch::nn::Sequential sync{torch::nn::BatchNorm2d(options)};
  ASSERT_EQ(fulgor::convert_sync_batchnorm(*sync), 1u);
  for (int step = 0; step < 3; ++step) {
    torch::Tensor a = x.clone().requires_grad_(true), b = x.clone().requires_grad_(true);
    torch::Tensor ya = plain->forward(a), yb = sync->forward(b);
    expect_close(yb, ya, 1e-6, "training output");
    (ya * ya).sum().backward();
    (yb * yb).sum().backward();
    expect_close(b.grad(), a.grad(), 1e-5, "input gradient");
    x = x * 1.5 + 0.25;
  }
  const auto expected = plain->named_buffers();
  for (const auto& item : sync->named_buffers())
    if (item.value().defined()) expect_close(item.value(), expected[item.key()], 1e-6, item.key());
  plain->eval();
  sync->eval();
  expect_close(sync->forward(x), plain->forward(x), 1e-6, "evaluation output");
}

TEST(SyncBatchNorm, WithoutAGroupIsABatchNorm) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({6, 4, 3, 2}) * 2 + 1;
  expect_same_as_batchnorm(torch::nn::BatchNormOptions(4), x);
  expect_same_as_batchnorm(torch::nn::BatchNormOptions(4).momentum(c10::nullopt).eps(1e-3), x);
  expect_same_as_batchnorm(torch::nn::BatchNormOptions(4).affine(false), x);
  expect_same_as_batchnorm(torch::nn::BatchNormOptions(4).track_running_stats(false), x);
}

TEST(SyncBatchNorm, RefusesAnInputOfOneDimension) {
  fulgor::SyncBatchNorm bn(3);
  try {
    bn->forward(torch::ones({3}));
    FAIL() << "no error";
  } catch (const fulgor::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expected at least 2D input (got 1D input)"), std::string::npos) << e.what();
  }
}

// A tree holding BatchNorm layers every way convert_sync_batchnorm can reach.
struct Tree : torch::nn::Module {
  torch::nn::Sequential seq{torch::nn::Linear(2, 3), torch::nn::BatchNorm1d(3)};
  torch::nn::ModuleDict dict;
  Tree() {
    register_module("seq", seq);
    dict = register_module("dict", torch::nn::ModuleDict());
    const auto bn = torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(2).eps(1e-3).momentum(0.5)).ptr();
    dict->update({{"bn", bn}});
    register_module("bn3", torch::nn::BatchNorm3d(torch::nn::BatchNormOptions(2).affine(false)));
  }
};

TEST(ConvertSyncBatchnorm, ReplacesEveryBatchNormKeepingItsStateAndRevertPutsThemBack) {
  Tree tree;
  torch::manual_seed(5);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : tree.parameters()) p.copy_(torch::randn(p.sizes()));
    for (auto& b : tree.buffers()) b.copy_(b.is_floating_point() ? torch::rand(b.sizes()) + 0.5 : torch::full({}, 7));
  }
  tree.dict["bn"]->as<torch::nn::BatchNorm2dImpl>()->bias.set_requires_grad(false);
  tree.eval();
  const auto params = tree.named_parameters();
  const auto buffers = tree.named_buffers();
  // Raw pointers: a BatchNorm held outside the module tree is refused.
  const torch::nn::Module* bn1 = tree.seq->ptr(1).get();
  const torch::nn::Module* bn2 = tree.dict["bn"].get();
  const torch::nn::Module* bn3 = tree.named_children()["bn3"].get();

  ASSERT_EQ(fulgor::convert_sync_batchnorm(tree), 3u);
  // The Sequential calls the new layer, and every tree sees it.
  ASSERT_NO_THROW(tree.seq->ptr<fulgor::SyncBatchNormImpl>(1));
  for (const auto& name : {"seq.1", "dict.bn", "bn3"}) {
    const auto modules = tree.named_modules("", /*include_self=*/false);
    ASSERT_TRUE(modules.contains(name)) << name;
    EXPECT_TRUE(modules[name]->as<fulgor::SyncBatchNormImpl>()) << name << " was not replaced";
    EXPECT_FALSE(modules[name]->is_training()) << name << " lost evaluation mode";
  }
  auto& dict_bn = *tree.dict["bn"]->as<fulgor::SyncBatchNormImpl>();
  EXPECT_EQ(dict_bn.options.eps(), 1e-3);
  EXPECT_EQ(dict_bn.options.momentum().value(), 0.5);
  EXPECT_FALSE(tree.named_children()["bn3"]->as<fulgor::SyncBatchNormImpl>()->options.affine());
  EXPECT_TRUE(dict_bn.weight.requires_grad());
  EXPECT_FALSE(dict_bn.bias.requires_grad());
  // The same names and values, in new tensors.
  const auto converted_params = tree.named_parameters();
  const auto converted_buffers = tree.named_buffers();
  ASSERT_EQ(converted_params.keys(), params.keys());
  ASSERT_EQ(converted_buffers.keys(), buffers.keys());
  for (const auto& item : params) EXPECT_TRUE(converted_params[item.key()].equal(item.value())) << item.key();
  for (const auto& item : buffers) EXPECT_TRUE(converted_buffers[item.key()].equal(item.value())) << item.key();
  // The same evaluation output.
  const torch::Tensor x = torch::randn({4, 2});
  fulgor::revert_sync_batchnorm(tree);
  const torch::Tensor before = tree.seq->forward(x);
  fulgor::convert_sync_batchnorm(tree);
  EXPECT_TRUE(tree.seq->forward(x).equal(before));

  // A training step changes the converted layers' state; revert gives it back
  // to the original BatchNorm objects.
  tree.train();
  tree.seq->forward(torch::randn({5, 2}));
  const torch::Tensor trained_mean = tree.named_buffers()["seq.1.running_mean"].clone();
  EXPECT_EQ(fulgor::revert_sync_batchnorm(tree), 3u);
  EXPECT_EQ(tree.seq->ptr(1).get(), bn1);
  EXPECT_EQ(tree.named_children()["seq"]->named_children()["1"].get(), bn1);
  EXPECT_EQ(tree.dict["bn"].get(), bn2);
  EXPECT_EQ(tree.named_children()["bn3"].get(), bn3);
  EXPECT_TRUE(tree.named_buffers()["seq.1.running_mean"].equal(trained_mean));
  EXPECT_EQ(tree.named_buffers()["seq.1.num_batches_tracked"].item<int64_t>(), 8);
  EXPECT_TRUE(tree.seq->ptr(1)->is_training());
  EXPECT_EQ(fulgor::revert_sync_batchnorm(tree), 0u);
}

TEST(ConvertSyncBatchnorm, KeepsASyncBatchNormBuiltAsSuch) {
  torch::nn::Sequential seq(fulgor::SyncBatchNorm(3));
  const auto layer = seq->ptr(0);
  EXPECT_EQ(fulgor::convert_sync_batchnorm(*seq), 0u);
  EXPECT_EQ(fulgor::revert_sync_batchnorm(*seq), 0u);
  EXPECT_EQ(seq->ptr(0), layer);
}

// What LibTorch gives no way to replace.
struct WithMember : torch::nn::Module {
  torch::nn::Sequential body{torch::nn::Linear(2, 2)};
  torch::nn::BatchNorm1d bn{nullptr};
  WithMember() {
    register_module("body", body);
    bn = register_module("bn", torch::nn::BatchNorm1d(2));
  }
};

struct WithList : torch::nn::Module {
  WithList() {
    register_module("first", torch::nn::Sequential(torch::nn::BatchNorm1d(2)));
    register_module("list", torch::nn::ModuleList(torch::nn::BatchNorm1d(2)));
  }
};

// The tree's modules by name, as raw pointers: holding them would count.
std::vector<std::pair<std::string, const torch::nn::Module*>> tree_of(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, const torch::nn::Module*>> tree;
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    tree.emplace_back(item.key(), item.value().get());
  return tree;
}

void expect_refused(torch::nn::Module& module, const std::string& path, const std::string& reason) {
  const auto before = tree_of(module);
  try {
    fulgor::convert_sync_batchnorm(module);
    FAIL() << "no error";
  } catch (const fulgor::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot replace '" + path + "' (torch::nn::BatchNorm1dImpl)"), std::string::npos) << what;
    EXPECT_NE(what.find(reason), std::string::npos) << what;
    EXPECT_NE(what.find("fulgor::SyncBatchNorm"), std::string::npos) << what;
  }
  EXPECT_EQ(tree_of(module), before) << "a module was replaced";
}

TEST(ConvertSyncBatchnorm, RefusesABatchNormHeldByAMemberOrAModuleList) {
  WithMember member;
  expect_refused(member, "bn", "typed member");
  WithList list;
  expect_refused(list, "list.0", "torch::nn::ModuleList");
}

// ---- two ranks on gloo -------------------------------------------------------

// The scenario's layer as a BatchNorm in one process on all samples: the loss
// is the sum of the ranks' losses, so the input's gradient is each rank's, and
// weight and bias get the sum of the ranks' shares.
TEST(SyncBatchNorm, TwoRanksNormalizeAsOneProcessOnBothBatches) {
  TempDir dir;
  auto [status, log] = run_two_ranks({"syncbn", dir.str()}, dir / "log");
  ASSERT_TRUE(exited_with(status, 0)) << log;
  for (const bool spatial : {false, true}) {
    SCOPED_TRACE(spatial ? "BatchNorm2d, float32, cumulative average" : "BatchNorm1d, float64, momentum 0.3");
    const std::string tag = spatial ? "2d_" : "1d_";
    const double tolerance = spatial ? 1e-5 : 1e-10;
    std::vector<std::string> names;
    for (const char* name : {"converted", "y", "x_grad", "weight_grad", "bias_grad", "running_mean", "running_var",
                             "num_batches_tracked", "eval"})
      names.push_back(tag + name);
    auto rank0 = load_tensors(dir / "syncbn_rank0.pt", names);
    auto rank1 = load_tensors(dir / "syncbn_rank1.pt", names);

    SyncBnCase sc = make_sync_bn_case(spatial);
    torch::Tensor x = sc.x.clone().requires_grad_(true);
    const torch::Tensor y = sc.layer->forward(x);
    (y * sc.upstream).sum().backward();
    const auto state = sc.layer->named_buffers();
    const auto params = sc.layer->named_parameters();
    sc.layer->eval();
    const torch::Tensor evaluated = sc.layer->forward(sc.x);

    for (auto* r : {&rank0, &rank1}) {
      EXPECT_EQ((*r)[tag + "converted"].item<int64_t>(), 1);
      expect_close((*r)[tag + "running_mean"], state["0.running_mean"], tolerance, "running_mean");
      expect_close((*r)[tag + "running_var"], state["0.running_var"], tolerance, "running_var");
      EXPECT_EQ((*r)[tag + "num_batches_tracked"].item<int64_t>(), 5);
    }
    const int64_t n0 = kSyncBnShard0, n1 = kSyncBnRows - kSyncBnShard0;
    expect_close(torch::cat({rank0[tag + "y"], rank1[tag + "y"]}), y.detach(), tolerance, "training output");
    expect_close(torch::cat({rank0[tag + "x_grad"], rank1[tag + "x_grad"]}), x.grad(), tolerance, "input gradient");
    expect_close(rank0[tag + "weight_grad"] + rank1[tag + "weight_grad"], params["0.weight"].grad(), tolerance,
                 "weight gradient");
    expect_close(rank0[tag + "bias_grad"] + rank1[tag + "bias_grad"], params["0.bias"].grad(), tolerance,
                 "bias gradient");
    expect_close(torch::cat({rank0[tag + "eval"], rank1[tag + "eval"]}), evaluated, tolerance, "evaluation output");
    EXPECT_EQ(rank0[tag + "y"].size(0), n0);
    EXPECT_EQ(rank1[tag + "y"].size(0), n1);
  }
}

// ---- the Trainer -------------------------------------------------------------

struct SyncBnFit {
  torch::Tensor params, running_mean, running_var;
};

SyncBnFit fit_in_one_process() {
  TempDir dir;
  RegressionNet model(make_batchnorm_model(init_seed(0)));
  auto loader = make_loader(1, 0);
  auto options = quiet(ddp_options(dir.str(), 2, 1));
  options.strategy = "single_device";
  options.sync_batchnorm = true;  // nothing to do in one process
  fulgor::Trainer trainer(options);
  trainer.fit(model, loader);
  auto& bn = *std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(model.net->ptr(1));
  return {flat_parameters(model), bn.running_mean.clone(), bn.running_var.clone()};
}

TEST(SyncBatchNorm, TrainerSyncBatchnormTrainsTwoRanksAsOneProcess) {
  const SyncBnFit expected = fit_in_one_process();
  for (const bool on : {true, false}) {
    SCOPED_TRACE(on ? "sync_batchnorm on" : "sync_batchnorm off");
    TempDir dir;
    auto [status, log] = run_two_ranks(FULGOR_DDP_TRAINER_WORKER, {"syncbn", dir.str(), on ? "on" : "off"}, dir / "log",
                                       std::chrono::seconds(180));
    ASSERT_TRUE(exited_with(status, 0)) << log;
    const torch::Tensor rank0 = read_tensor(dir / "params_rank0.pt", "final");
    const torch::Tensor rank1 = read_tensor(dir / "params_rank1.pt", "final");
    EXPECT_TRUE(torch::equal(rank0, rank1)) << "the ranks' parameters differ";
    if (on) {
      expect_close(rank0, expected.params, 1e-5, "parameters");
      for (const std::string rank : {"0", "1"}) {
        const std::string file = dir / ("syncbn_rank" + rank + ".pt");
        expect_close(read_tensor(file, "running_mean"), expected.running_mean, 1e-5, "running_mean");
        expect_close(read_tensor(file, "running_var"), expected.running_var, 1e-5, "running_var");
        EXPECT_EQ(read_tensor(file, "num_batches_tracked").item<int64_t>(), 2 * kStepsPerEpoch);
        EXPECT_TRUE(read_tensor(file, "same_layer").item<bool>()) << "the fit did not put the BatchNorm back";
      }
    } else {
      // Each rank normalizing by its own batch trains another model.
      EXPECT_FALSE(torch::allclose(rank0, expected.params, 1e-3, 1e-3));
    }
  }
}

}  // namespace
