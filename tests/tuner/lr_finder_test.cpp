// The learning-rate finder against Lightning 2.6.5's: lr_finder_reference.py
// replays Lightning's schedulers, smoothing, stop rule and suggestion on the
// losses fulgor's sweeps saw; and the fit around a sweep goes on bit for bit
// as without one.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../support/python_reference.h"
#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

using Json = nlohmann::json;

// TinyNet with its rate in hparams()["lr"] and SGD at that rate, keeping
// each training_step's loss.
struct SweptNet : TinyNet {
  std::vector<double> raw_losses;
  SweptNet() {
    save_hyperparameters({{"lr", 0.05}});
    make_optimizers = [](TinyNet& m) {
      return OptimizerConfig(std::make_shared<torch::optim::SGD>(
          m.parameters(), torch::optim::SGDOptions(m.hparams().at("lr").get<double>())));
    };
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    auto loss = TinyNet::training_step(std::move(batch), batch_idx);
    raw_losses.push_back(loss.item<double>());
    return loss;
  }
};

std::unique_ptr<SweptNet> swept_net(uint64_t seed) {
  torch::manual_seed(seed);
  auto net = std::make_unique<SweptNet>();
  return net;
}

void expect_sweep_values(const std::vector<double>& actual, const Json& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double e = expected[i].get<double>();
    EXPECT_NEAR(actual[i], e, 1e-12 * std::abs(e)) << what << " [" << i << "]";
  }
}

TEST(LearningRateFinder, SweepsAndSuggestionsMatchLightning) {
  struct Case {
    LrFindOptions options;
    int64_t batches_per_epoch;
  };
  std::vector<Case> cases(3);
  cases[0].options = {.min_lr = 1e-4, .max_lr = 30.0, .num_training = 60};  // diverges
  cases[0].batches_per_epoch = 64;
  cases[1].options = {
      .min_lr = 1e-3, .max_lr = 0.3, .num_training = 30, .mode = "linear", .early_stop_threshold = std::nullopt};
  cases[1].batches_per_epoch = 64;
  cases[2].options = {.min_lr = 1e-6, .max_lr = 1.0, .num_training = 40};  // over three epochs
  cases[2].batches_per_epoch = 16;

  Json request = {{"sweeps", Json::array()}, {"curves", Json::array()}};
  std::vector<LRFinder> found;
  for (const auto& c : cases) {
    TempDir dir;
    auto net = swept_net(11);
    auto loader = shuffled_loader(c.batches_per_epoch * 8, 8);
    Trainer trainer(quiet(dir, 100));
    auto finder = Tuner(trainer).lr_find(*net, loader, c.options);
    ASSERT_TRUE(finder.has_value());
    const auto& o = c.options;
    request["sweeps"].push_back(
        {{"mode", o.mode},
         {"min_lr", o.min_lr},
         {"max_lr", o.max_lr},
         {"num_training", o.num_training},
         {"early_stop_threshold", o.early_stop_threshold ? Json(*o.early_stop_threshold) : Json()},
         {"start_step", 0},
         {"raw_losses", net->raw_losses}});
    // update_attr: the suggestion is the module's rate for the fit to come.
    ASSERT_TRUE(finder->suggestion().has_value());
    EXPECT_EQ(net->hparams().at("lr").get<double>(), *finder->suggestion());
    // The sweep stopped on its own: the module trained no step beyond it.
    EXPECT_EQ(net->raw_losses.size(), finder->results().lr.size());
    found.push_back(std::move(*finder));
  }
  EXPECT_LT(found[0].results().loss.size(), 60u) << "the first sweep should diverge and stop early";
  EXPECT_EQ(found[1].results().loss.size(), 30u);
  EXPECT_EQ(found[2].results().loss.size(), 40u);

  // Curves with gaps (NaN, infinity), under several skips; Python's slice
  // [b:-0] is empty, and so is one past the end.
  std::vector<double> lr, loss;
  for (int i = 0; i < 40; ++i) {
    lr.push_back(1e-5 * std::pow(1.3, i));
    loss.push_back(2.0 - std::tanh((i - 22) / 5.0) + 0.01 * std::sin(3.0 * i));
  }
  loss[14] = std::numeric_limits<double>::quiet_NaN();
  loss[23] = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<int64_t, int64_t>> skips = {{10, 1}, {0, 1}, {3, 5}, {30, 8}, {0, 0}, {40, 1}, {38, 1}};
  LRFinder curve("exponential", lr.front(), lr.back(), 40, {lr, loss});
  for (const auto& [b, e] : skips) {
    Json json_loss = Json::array();
    for (double v : loss) json_loss.push_back(std::isfinite(v) ? Json(v) : Json(v > 0 ? "inf" : "nan"));
    request["curves"].push_back({{"lr", lr}, {"loss", json_loss}, {"skip_begin", b}, {"skip_end", e}});
  }

  const std::string input = ::testing::TempDir() + "fulgor_lr_finder_in_" + std::to_string(::getpid()) + ".json";
  std::ofstream(input) << request.dump();
  const Json reference =
      test::python_reference(FULGOR_PYTHON_TORCH, std::string(FULGOR_LR_FINDER_REFERENCE) + " " + input, "lr_finder");
  std::remove(input.c_str());

  for (size_t i = 0; i < found.size(); ++i) {
    const auto& expected = reference["sweeps"][i];
    const auto& results = found[i].results();
    expect_sweep_values(results.lr, expected["lr"], "rates of sweep " + std::to_string(i));
    expect_sweep_values(results.loss, expected["loss"], "smoothed losses of sweep " + std::to_string(i));
    ASSERT_FALSE(expected["optimal_idx"].is_null());
    EXPECT_EQ(found[i].optimal_index(), expected["optimal_idx"].get<size_t>()) << "sweep " << i;
  }
  for (size_t i = 0; i < skips.size(); ++i) {
    const auto& expected = reference["curves"][i];
    const auto index = curve.optimal_index(skips[i].first, skips[i].second);
    if (expected.is_null()) {
      EXPECT_FALSE(index.has_value()) << "skips " << skips[i].first << ", " << skips[i].second;
    } else {
      EXPECT_EQ(index, expected.get<size_t>()) << "skips " << skips[i].first << ", " << skips[i].second;
    }
  }
}

// A sweep as Lightning's FineTuneLearningRateFinder runs it: at the start of
// the epochs given, in the middle of a fit with Adam's moments, a StepLR and
// dropout drawing from the generator.
struct SweepAtEpochs : LearningRateFinder {
  std::vector<int64_t> epochs;
  int64_t sweeps = 0;
  SweepAtEpochs(std::vector<int64_t> at, LrFindOptions options) : LearningRateFinder(options), epochs(std::move(at)) {}
  void on_fit_start(Trainer&, ModuleBase&) override {}
  void on_train_epoch_start(Trainer& trainer, ModuleBase& module) override {
    if (std::find(epochs.begin(), epochs.end(), trainer.current_epoch()) == epochs.end()) return;
    lr_find(trainer, module);
    ++sweeps;
  }
};

struct FitOutcome {
  std::vector<torch::Tensor> weights;
  std::vector<double> scheduler_lrs;
  double optimizer_lr;
  int64_t global_step, training_steps;
  std::map<std::string, double> callback_metrics;
};

FitOutcome fit_adam(std::vector<std::shared_ptr<Callback>> callbacks) {
  TempDir dir;
  auto net = adam_step_lr_net(5, 0.2);
  auto loader = shuffled_loader(96, 8);
  Trainer trainer(quiet(dir, 3, std::move(callbacks)));
  trainer.fit(*net, loader);
  FitOutcome out;
  for (const auto& p : net->parameters()) out.weights.push_back(p.detach().clone());
  out.scheduler_lrs = trainer.lr_schedulers()[0].scheduler->get_last_lr();
  out.optimizer_lr = trainer.optimizers()[0]->param_groups()[0].options().get_lr();
  out.global_step = trainer.global_step();
  out.training_steps = net->training_steps;
  out.callback_metrics = trainer.callback_metrics();
  return out;
}

TEST(LearningRateFinder, FitAroundASweepGoesOnBitForBit) {
  const FitOutcome plain = fit_adam({});
  LrFindOptions options{.min_lr = 1e-5, .max_lr = 1.0, .num_training = 7, .update_attr = false};
  auto at_start = std::make_shared<LearningRateFinder>(options);
  auto mid_fit = std::make_shared<SweepAtEpochs>(std::vector<int64_t>{1, 2}, options);
  for (const auto& finder : {std::shared_ptr<Callback>(at_start), std::shared_ptr<Callback>(mid_fit)}) {
    SCOPED_TRACE(finder == at_start ? "at on_fit_start" : "at epochs 1 and 2");
    const FitOutcome swept = fit_adam({finder});
    ASSERT_EQ(swept.weights.size(), plain.weights.size());
    for (size_t i = 0; i < plain.weights.size(); ++i) EXPECT_TRUE(torch::equal(swept.weights[i], plain.weights[i]));
    EXPECT_EQ(swept.scheduler_lrs, plain.scheduler_lrs);
    EXPECT_EQ(swept.optimizer_lr, plain.optimizer_lr);
    EXPECT_EQ(swept.global_step, plain.global_step);
    EXPECT_EQ(swept.callback_metrics, plain.callback_metrics);
    EXPECT_GT(swept.training_steps, plain.training_steps);  // the sweeps trained too
  }
  EXPECT_EQ(mid_fit->sweeps, 2);
  // A sweep later in the fit counts its own steps (Note [Steps of a sweep later in a fit]).
  ASSERT_TRUE(mid_fit->result().has_value());
  EXPECT_EQ(mid_fit->result()->results().lr.size(), 7u);
  ASSERT_TRUE(at_start->result().has_value());
  EXPECT_EQ(at_start->result()->results().lr.size(), 7u);
}

TEST(LearningRateFinder, TunerLeavesTheModuleAsItWas) {
  TempDir dir;
  auto net = swept_net(3);
  std::vector<torch::Tensor> before;
  for (const auto& p : net->parameters()) before.push_back(p.detach().clone());
  auto loader = shuffled_loader(64, 8);
  Trainer trainer(quiet(dir, 10));
  Tuner tuner(trainer);
  torch::manual_seed(77);
  const auto finder =
      tuner.lr_find(*net, loader, {.num_training = 20, .early_stop_threshold = std::nullopt, .update_attr = false});
  ASSERT_TRUE(finder.has_value());
  EXPECT_EQ(net->training_steps, 20);
  const auto params = net->parameters();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(params[i], before[i]));
  EXPECT_EQ(net->hparams().at("lr").get<double>(), 0.05);  // update_attr false
  // The generators are put back too, as Lightning's isolate_rng.
  const torch::Tensor drawn = torch::randn({4});
  torch::manual_seed(77);
  EXPECT_TRUE(torch::equal(drawn, torch::randn({4})));
  // Nothing is left in default_root_dir, and the Trainer fits as usual.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
  EXPECT_TRUE(trainer.callbacks().end() ==
              std::find_if(trainer.callbacks().begin(), trainer.callbacks().end(),
                           [](const auto& cb) { return dynamic_cast<LearningRateFinder*>(cb.get()); }));
  trainer.fit(*net, loader);
  EXPECT_EQ(trainer.global_step(), 80);
}

TEST(LearningRateFinder, UpdateAttrSetsTheRateOfTheFit) {
  TempDir dir;
  auto net = swept_net(4);
  auto loader = shuffled_loader(256, 8);
  auto finder = std::make_shared<LearningRateFinder>(LrFindOptions{.min_lr = 1e-5, .max_lr = 1.0, .num_training = 30});
  Trainer trainer(quiet(dir, 1, {finder}));
  trainer.fit(*net, loader);
  ASSERT_TRUE(finder->result() && finder->result()->suggestion());
  const double lr = *finder->result()->suggestion();
  EXPECT_NE(lr, 0.05);
  EXPECT_EQ(net->hparams().at("lr").get<double>(), lr);
  EXPECT_EQ(trainer.optimizers()[0]->param_groups()[0].options().get_lr(), lr);
  EXPECT_EQ(trainer.global_step(), 32);  // the fit's own epoch after the sweep
}

TEST(LearningRateFinder, RefusesWhatItCannotSweep) {
  EXPECT_THROW(LearningRateFinder({.mode = "cosine"}), ConfigError);
  EXPECT_NO_THROW(LearningRateFinder({.mode = "Linear"}));
  EXPECT_THROW(LearningRateFinder({.num_training = 0}), ConfigError);
  EXPECT_THROW(LearningRateFinder({.min_lr = 0.0}), ConfigError);

  TempDir dir;
  auto loader = shuffled_loader(64, 8);
  auto no_lr = swept_net(1);
  no_lr->save_hyperparameters({{"rate", 0.1}});
  no_lr->make_optimizers = [](TinyNet& m) {
    return OptimizerConfig(std::make_shared<torch::optim::SGD>(m.parameters(), 0.1));
  };
  Trainer trainer(quiet(dir, 1));
  try {
    Tuner(trainer).lr_find(*no_lr, loader);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"learning_rate\""), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Tuner(trainer).lr_find(*no_lr, loader, {.num_training = 5, .attr_name = "rate"}));
  EXPECT_EQ(no_lr->hparams().size(), 1u);

  auto two = swept_net(2);
  two->make_optimizers = [](TinyNet& m) {
    return OptimizerConfig({std::make_shared<torch::optim::SGD>(m.l1->parameters(), 0.1),
                            std::make_shared<torch::optim::SGD>(m.l2->parameters(), 0.1)});
  };
  two->set_automatic_optimization(false);
  EXPECT_THROW(Tuner(trainer).lr_find(*two, loader), ConfigError);

  Trainer with_finder(quiet(dir, 1, {std::make_shared<LearningRateFinder>()}));
  EXPECT_THROW(Tuner(with_finder).lr_find(*swept_net(3), loader), ConfigError);

  auto debug_options = quiet(dir, 1);
  debug_options.fast_dev_run = 2;
  Trainer debug(debug_options);
  auto net = swept_net(4);
  EXPECT_FALSE(Tuner(debug).lr_find(*net, loader).has_value());
  EXPECT_EQ(net->training_steps, 0);
}
}  // namespace
}  // namespace fulgor::testing
