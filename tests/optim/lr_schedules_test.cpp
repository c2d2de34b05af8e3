// fulgor's learning-rate schedules against torch.optim.lr_scheduler's: the
// cases of lr_schedules_reference.py, run by Debian's python3-torch, compared
// value by value; and their state across a resume, alone and in fit.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../support/python_reference.h"
#include "../support/tiny.h"
#include "fulgor/fulgor.h"
#include "warmup_cosine.h"  // docs/training.md's LitWarmupCosine, as written there

namespace fulgor::testing {
namespace {

using Json = nlohmann::json;

// The factor functions of lr_schedules_reference.py.
std::function<double(int64_t)> factor_named(const std::string& name) {
  if (name == "pow097") return [](int64_t e) { return std::pow(0.97, static_cast<double>(e)); };
  if (name == "warmup10") return [](int64_t e) { return std::min(1.0, static_cast<double>(e + 1) / 10); };
  if (name == "const098") return [](int64_t) { return 0.98; };
  if (name == "slowing") return [](int64_t e) { return 1.0 - 1.0 / static_cast<double>(e + 20); };
  throw std::runtime_error("no factor function named " + name);
}

// A number or a list of them, as Python's arguments give it.
std::vector<double> values(const Json& v) {
  return v.is_array() ? v.get<std::vector<double>>() : std::vector<double>{v.get<double>()};
}

std::shared_ptr<LRScheduler> make_schedule(const Json& spec, torch::optim::Optimizer& optimizer);

std::shared_ptr<LRScheduler> make_cyclic(const std::string& type, const Json& a, torch::optim::Optimizer& opt) {
  if (type == "CyclicLR") {
    CyclicOptions o{values(a.at("base_lr")), values(a.at("max_lr"))};
    o.step_size_up = a.value("step_size_up", o.step_size_up);
    if (a.contains("step_size_down")) o.step_size_down = a.at("step_size_down").get<double>();
    o.mode = a.value("mode", o.mode);
    o.gamma = a.value("gamma", o.gamma);
    if (a.contains("base_momentum")) o.base_momentum = values(a.at("base_momentum"));
    if (a.contains("max_momentum")) o.max_momentum = values(a.at("max_momentum"));
    return std::make_shared<CyclicLR>(opt, o);
  }
  OneCycleOptions o{values(a.at("max_lr"))};
  if (a.contains("total_steps")) o.total_steps = a.at("total_steps").get<int64_t>();
  if (a.contains("epochs")) o.epochs = a.at("epochs").get<int64_t>();
  if (a.contains("steps_per_epoch")) o.steps_per_epoch = a.at("steps_per_epoch").get<int64_t>();
  o.pct_start = a.value("pct_start", o.pct_start);
  o.anneal_strategy = a.value("anneal_strategy", o.anneal_strategy);
  o.cycle_momentum = a.value("cycle_momentum", o.cycle_momentum);
  if (a.contains("base_momentum")) o.base_momentum = values(a.at("base_momentum"));
  if (a.contains("max_momentum")) o.max_momentum = values(a.at("max_momentum"));
  o.div_factor = a.value("div_factor", o.div_factor);
  o.final_div_factor = a.value("final_div_factor", o.final_div_factor);
  o.three_phase = a.value("three_phase", o.three_phase);
  return std::make_shared<OneCycleLR>(opt, o);
}

std::shared_ptr<LRScheduler> make_plain(const std::string& type, const Json& a, torch::optim::Optimizer& opt) {
  if (type == "StepLR") return std::make_shared<StepLR>(opt, a.at("step_size"), a.value("gamma", 0.1));
  if (type == "MultiStepLR")
    return std::make_shared<MultiStepLR>(opt, a.at("milestones").get<std::vector<int64_t>>(), a.value("gamma", 0.1));
  if (type == "ConstantLR")
    return std::make_shared<ConstantLR>(opt, a.value("factor", 1.0 / 3), a.value("total_iters", int64_t{5}));
  if (type == "LinearLR")
    return std::make_shared<LinearLR>(opt, a.value("start_factor", 1.0 / 3), a.value("end_factor", 1.0),
                                      a.value("total_iters", int64_t{5}));
  if (type == "ExponentialLR") return std::make_shared<ExponentialLR>(opt, a.at("gamma").get<double>());
  if (type == "PolynomialLR")
    return std::make_shared<PolynomialLR>(opt, a.value("total_iters", int64_t{5}), a.value("power", 1.0));
  if (type == "CosineAnnealingLR")
    return std::make_shared<CosineAnnealingLR>(opt, a.at("T_max"), a.value("eta_min", 0.0));
  if (type == "CosineAnnealingWarmRestarts")
    return std::make_shared<CosineAnnealingWarmRestarts>(opt, a.at("T_0"), a.value("T_mult", int64_t{1}),
                                                         a.value("eta_min", 0.0));
  return make_cyclic(type, a, opt);
}

std::shared_ptr<LRScheduler> make_schedule(const Json& spec, torch::optim::Optimizer& optimizer) {
  const auto type = spec.at("type").get<std::string>();
  if (type == "SequentialLR" || type == "ChainedScheduler") {
    std::vector<std::shared_ptr<LRScheduler>> parts;
    for (const auto& part : spec.at("schedulers")) parts.push_back(make_schedule(part, optimizer));
    if (type == "ChainedScheduler") return std::make_shared<ChainedScheduler>(parts);
    return std::make_shared<SequentialLR>(optimizer, parts, spec.at("milestones").get<std::vector<int64_t>>());
  }
  if (type == "LambdaLR") return std::make_shared<LambdaLR>(optimizer, factor_named(spec.at("factor")));
  if (type == "MultiplicativeLR") return std::make_shared<MultiplicativeLR>(optimizer, factor_named(spec.at("factor")));
  return make_plain(type, spec.at("args"), optimizer);
}

// One parameter per group, with the case's rates, as the script's optimizer.
struct CaseOptimizer {
  std::vector<torch::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  CaseOptimizer(const std::string& kind, const std::vector<double>& lrs) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (double lr : lrs) {
      params.push_back(torch::zeros({1}, torch::requires_grad()));
      if (kind == "sgd")
        groups.emplace_back(std::vector<torch::Tensor>{params.back()},
                            std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(lr).momentum(0.9)));
      else
        groups.emplace_back(std::vector<torch::Tensor>{params.back()}, std::make_unique<torch::optim::AdamOptions>(lr));
    }
    if (kind == "sgd")
      optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lrs[0]).momentum(0.9));
    else
      optimizer = std::make_unique<torch::optim::Adam>(groups, torch::optim::AdamOptions(lrs[0]));
  }
  std::vector<double> lrs() const {
    std::vector<double> v;
    for (const auto& g : optimizer->param_groups()) v.push_back(g.options().get_lr());
    return v;
  }
  std::vector<double> momenta() const {
    std::vector<double> v;
    for (auto& g : optimizer->param_groups()) {
      auto& o = const_cast<torch::optim::OptimizerOptions&>(g.options());
      if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o))
        v.push_back(sgd->momentum());
      else
        v.push_back(std::get<0>(dynamic_cast<torch::optim::AdamOptions&>(o).betas()));
    }
    return v;
  }
};

// The reference, recorded once per run of this executable.
const Json& reference() {
  static const Json json =
      fulgor::test::python_reference(FULGOR_PYTHON_TORCH, FULGOR_SCHEDULES_REFERENCE, "lr_schedules");
  return json;
}

bool close(double a, double b) { return a == b || std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)); }

void expect_rows(const Json& expected, const std::vector<std::vector<double>>& actual, const std::string& what,
                 const std::string& label) {
  ASSERT_EQ(expected.size(), actual.size()) << label;
  for (size_t step = 0; step < actual.size(); ++step) {
    const auto want = expected[step].get<std::vector<double>>();
    ASSERT_EQ(want.size(), actual[step].size()) << label;
    for (size_t g = 0; g < want.size(); ++g)
      ASSERT_TRUE(close(want[g], actual[step][g]))
          << label << ": " << what << " of group " << g << " after " << step << " steps: torch "
          << fmt::format("{:.17g}", want[g]) << ", fulgor " << fmt::format("{:.17g}", actual[step][g]);
  }
}

// Runs every case of `schedule` and compares it with torch's values.
void compare_with_torch(const std::string& schedule) {
  const auto& ref = reference();
  int compared = 0;
  std::string skipped;
  for (const auto& c : ref.at("cases")) {
    if (c.at("schedule") != schedule) continue;
    const std::string label = schedule + " " + c.at("spec").dump() + " on " + c.at("optimizer").get<std::string>();
    if (c.contains("skipped")) {
      skipped += "\n" + label + ": " + c.at("skipped").get<std::string>();
      continue;
    }
    CaseOptimizer opt(c.at("optimizer"), c.at("group_lrs").get<std::vector<double>>());
    auto scheduler = make_schedule(c.at("spec"), *opt.optimizer);
    std::vector<std::vector<double>> lrs{opt.lrs()}, momenta{opt.momenta()};
    for (int64_t i = 0; i < ref.at("steps").get<int64_t>(); ++i) {
      scheduler->step();
      lrs.push_back(opt.lrs());
      momenta.push_back(opt.momenta());
    }
    expect_rows(c.at("lrs"), lrs, "rate", label);
    expect_rows(c.at("momenta"), momenta, "momentum", label);
    ++compared;
  }
  if (!skipped.empty()) std::cout << "cases this torch cannot run:" << skipped << "\n";
  if (compared == 0) GTEST_SKIP() << "torch " << ref.at("torch") << " has no case of " << schedule << skipped;
}

TEST(LRSchedulesMatchTorch, LambdaLR) { compare_with_torch("LambdaLR"); }
TEST(LRSchedulesMatchTorch, MultiplicativeLR) { compare_with_torch("MultiplicativeLR"); }
TEST(LRSchedulesMatchTorch, StepLR) { compare_with_torch("StepLR"); }
TEST(LRSchedulesMatchTorch, MultiStepLR) { compare_with_torch("MultiStepLR"); }
TEST(LRSchedulesMatchTorch, ConstantLR) { compare_with_torch("ConstantLR"); }
TEST(LRSchedulesMatchTorch, LinearLR) { compare_with_torch("LinearLR"); }
TEST(LRSchedulesMatchTorch, ExponentialLR) { compare_with_torch("ExponentialLR"); }
TEST(LRSchedulesMatchTorch, PolynomialLR) { compare_with_torch("PolynomialLR"); }
TEST(LRSchedulesMatchTorch, CosineAnnealingLR) { compare_with_torch("CosineAnnealingLR"); }
TEST(LRSchedulesMatchTorch, CosineAnnealingWarmRestarts) { compare_with_torch("CosineAnnealingWarmRestarts"); }
TEST(LRSchedulesMatchTorch, OneCycleLR) { compare_with_torch("OneCycleLR"); }
TEST(LRSchedulesMatchTorch, CyclicLR) { compare_with_torch("CyclicLR"); }
TEST(LRSchedulesMatchTorch, SequentialLR) { compare_with_torch("SequentialLR"); }
TEST(LRSchedulesMatchTorch, ChainedScheduler) { compare_with_torch("ChainedScheduler"); }

// lr_schedules_reference.py's plateau_metric.
double plateau_metric(const std::string& mode, int64_t step) {
  const double k = static_cast<double>(step);
  const double value = 1 / (1 + 0.05 * k) + 0.02 * std::sin(0.9 * k);
  return mode == "min" ? value : -value;
}

// ReduceLROnPlateau in both threshold modes, with eps, cooldown and min_lr.
TEST(LRSchedulesMatchTorch, ReduceLROnPlateau) {
  const auto& ref = reference();
  const auto& cases = ref.at("plateau_cases");
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    const auto& a = c.at("args");
    PlateauOptions o;
    o.mode = a.at("mode");
    o.factor = a.at("factor");
    o.patience = a.at("patience");
    o.threshold = a.at("threshold");
    o.threshold_mode = a.value("threshold_mode", o.threshold_mode);
    o.cooldown = a.value("cooldown", o.cooldown);
    o.min_lr = a.value("min_lr", o.min_lr);
    o.eps = a.value("eps", o.eps);
    CaseOptimizer opt(c.at("optimizer"), c.at("group_lrs").get<std::vector<double>>());
    ReduceLROnPlateau plateau(*opt.optimizer, o);
    std::vector<std::vector<double>> lrs{opt.lrs()};
    for (int64_t step = 1; step <= ref.at("steps").get<int64_t>(); ++step) {
      plateau.step(plateau_metric(o.mode, step));
      lrs.push_back(opt.lrs());
    }
    expect_rows(c.at("lrs"), lrs, "rate", "ReduceLROnPlateau " + a.dump());
  }
  CaseOptimizer opt("sgd", {0.1});
  EXPECT_THROW(ReduceLROnPlateau(*opt.optimizer, {.threshold_mode = "absolute"}), ConfigError);
}

// Every case, stopped halfway and continued by a fresh schedule on a fresh
// optimizer from the state (through JSON text, as a checkpoint holds it),
// gives the uninterrupted sequence exactly.
TEST(LRSchedules, StateContinuesEverySequenceExactly) {
  const auto& ref = reference();
  for (const auto& c : ref.at("cases")) {
    if (c.contains("skipped")) continue;
    const auto lrs = c.at("group_lrs").get<std::vector<double>>();
    CaseOptimizer whole(c.at("optimizer"), lrs), first(c.at("optimizer"), lrs);
    auto straight = make_schedule(c.at("spec"), *whole.optimizer);
    auto interrupted = make_schedule(c.at("spec"), *first.optimizer);
    for (int i = 0; i < 117; ++i) {
      straight->step();
      interrupted->step();
    }
    const auto text = interrupted->state_dict().dump();
    interrupted.reset();
    CaseOptimizer second(c.at("optimizer"), lrs);
    auto resumed = make_schedule(c.at("spec"), *second.optimizer);
    resumed->load_state_dict(Json::parse(text));
    for (int i = 0; i < 100; ++i) {
      straight->step();
      resumed->step();
      ASSERT_EQ(whole.lrs(), second.lrs()) << c.at("spec").dump() << " step " << i;
      ASSERT_EQ(whole.momenta(), second.momenta()) << c.at("spec").dump() << " step " << i;
    }
  }
}

TEST(LRSchedules, BadArgumentsAreRefusedNamingThem) {
  CaseOptimizer opt("sgd", {0.1});
  auto& o = *opt.optimizer;
  auto refuses = [](const std::function<void()>& make, const std::string& what) {
    try {
      make();
      ADD_FAILURE() << what << ": accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refuses([&] { LinearLR(o, 0.0); }, "start_factor=0");
  refuses([&] { ConstantLR(o, 1.5); }, "factor=1.5");
  refuses([&] { CosineAnnealingLR(o, 0); }, "T_max=0");
  refuses([&] { CosineAnnealingWarmRestarts(o, 10, 0); }, "T_mult=0");
  refuses([&] { CyclicLR(o, {{0.1}, {1.0}, 20, std::nullopt, "triangle"}); }, "mode \"triangle\"");
  refuses([&] { CyclicLR(o, {{0.1, 0.2}, {1.0}}); }, "base_lr has 2 values");
  refuses([&] { OneCycleLR(o, {{0.1}}); }, "give total_steps");
  refuses([&] { OneCycleLR(o, {{0.1}, 100, std::nullopt, std::nullopt, 0.3, "cosine"}); }, "\"cosine\"");
  {
    CaseOptimizer adagrad_like("sgd", {0.1});
    torch::optim::Adagrad adagrad(std::vector<torch::Tensor>{adagrad_like.params[0]});
    refuses([&] { OneCycleLR(adagrad, {{0.1}, 100}); }, "cycle_momentum needs an optimizer with momentum");
  }
  auto warmup = std::make_shared<LinearLR>(o);
  auto plateau = std::make_shared<ReduceLROnPlateau>(o);
  refuses([&] { SequentialLR(o, {warmup}, {5}); }, "1 milestones for 1 schedulers");
  refuses([&] { SequentialLR(o, {warmup, plateau}, {5}); }, "scheduler 1 needs a monitored metric");
  refuses([&] { ChainedScheduler({}); }, "no first scheduler");
  CaseOptimizer other("sgd", {0.1});
  auto elsewhere = std::make_shared<ExponentialLR>(*other.optimizer, 0.9);
  refuses([&] { ChainedScheduler({warmup, elsewhere}); }, "scheduler 1 sets another optimizer's rates");
  OneCycleLR short_cycle(o, {{0.1}, 3});
  for (int i = 0; i < 3; ++i) short_cycle.step();
  refuses([&] { short_cycle.step(); }, "stepped 4 times; total_steps is 3");
}

// Warmup then cosine per step, every 2 steps, in fit: the rates follow the
// schedule's own sequence, and a fit resumed from a mid-run checkpoint ends
// where an uninterrupted one does.
struct RateLog : Callback {
  std::vector<double> lrs;
  void on_train_batch_start(Trainer& trainer, ModuleBase&, int64_t) override {
    lrs.push_back(trainer.optimizers()[0]->param_groups()[0].options().get_lr());
  }
};

OptimizerConfig warmup_cosine(TinyNet& m) {
  auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto warmup = std::make_shared<LinearLR>(*sgd, 0.1, 1.0, 3);
  auto cosine = std::make_shared<CosineAnnealingLR>(*sgd, 10, 0.001);
  return OptimizerConfig(
      sgd, {.scheduler = std::make_shared<SequentialLR>(*sgd, std::vector<std::shared_ptr<LRScheduler>>{warmup, cosine},
                                                        std::vector<int64_t>{3}),
            .interval = Interval::step,
            .frequency = 2});
}

TEST(LRSchedules, WarmupCosineStepsInFitAndResumesExactly) {
  TempDir dir;
  auto train = sequential_loader(32, 4);  // 8 steps an epoch
  torch::manual_seed(3);
  TinyNet straight;
  straight.make_optimizers = warmup_cosine;
  auto whole_log = std::make_shared<RateLog>();
  Trainer whole(quiet(dir, 4, {whole_log}));
  whole.fit(straight, train);

  // The expected sequence: the schedule stepped every 2 optimizer steps.
  TinyNet probe;
  auto config = warmup_cosine(probe);
  std::vector<double> expected;
  for (int64_t step = 0; step < 32; ++step) {
    if (step > 0 && step % 2 == 0) config.schedulers[0].scheduler->step();
    expected.push_back(config.optimizers[0]->param_groups()[0].options().get_lr());
  }
  EXPECT_EQ(whole_log->lrs, expected);

  torch::manual_seed(3);
  TinyNet first;
  first.make_optimizers = warmup_cosine;
  Trainer half(quiet(dir, 2));
  half.fit(first, train);
  const auto path = (dir.path / "half.ckpt").string();
  half.save_checkpoint(path);
  TinyNet resumed;
  resumed.make_optimizers = warmup_cosine;
  auto resumed_log = std::make_shared<RateLog>();
  Trainer rest(quiet(dir, 4, {resumed_log}));
  rest.fit(resumed, train, {.ckpt_path = path});
  EXPECT_EQ(resumed_log->lrs, std::vector<double>(expected.begin() + 16, expected.end()));
  EXPECT_TRUE(same_parameters(straight, resumed));
}

// docs/training.md's recipe: the rate rises for the warmup's steps, is the
// optimizer's own at the milestone, and decays after it.
TEST(LRSchedules, TheDocsWarmupCosineRecipeTrains) {
  TempDir dir;
  auto train = sequential_loader(32, 4);  // 8 steps an epoch
  LitWarmupCosine model(4, 16);
  std::vector<double> lrs;
  LambdaHooks h;
  h.on_train_batch_start = [&lrs](Trainer& t, ModuleBase&, int64_t) {
    lrs.push_back(t.optimizers()[0]->param_groups()[0].options().get_lr());
  };
  Trainer trainer(quiet(dir, 2, {std::make_shared<LambdaCallback>(h)}));
  trainer.fit(model, train);
  ASSERT_EQ(lrs.size(), 16u);
  EXPECT_DOUBLE_EQ(lrs[0], 1e-3 * 0.01);
  EXPECT_DOUBLE_EQ(lrs[4], 1e-3);
  for (size_t i = 1; i <= 4; ++i) EXPECT_GT(lrs[i], lrs[i - 1]) << i;
  for (size_t i = 5; i < lrs.size(); ++i) EXPECT_LT(lrs[i], lrs[i - 1]) << i;
  EXPECT_GT(lrs.back(), 1e-5);
}

// The recipe's Trainer: the module ends with the average of the weights of
// the steps after the warmup, which differs from the weights it trained to.
TEST(LRSchedules, TheDocsRecipeTrainerAveragesAfterTheWarmup) {
  TempDir dir;
  auto train = sequential_loader(32, 4);  // 8 steps an epoch
  LitWarmupCosine model(4, 16);
  auto options = warmup_cosine_trainer(4, 2);
  auto defaults = quiet(dir, 2);
  options.accelerator = defaults.accelerator;
  options.logger = false;
  options.enable_checkpointing = false;
  options.enable_progress_bar = false;
  options.enable_model_summary = false;
  options.default_root_dir = dir.str();
  std::vector<torch::Tensor> trained;
  LambdaHooks h;
  h.on_train_batch_end = [&trained](Trainer&, ModuleBase& m, const torch::Tensor&, int64_t) {
    trained = {m.parameters()[0].detach().clone()};
  };
  options.callbacks.push_back(std::make_shared<LambdaCallback>(h));
  const auto ema = std::dynamic_pointer_cast<EMAWeightAveraging>(options.callbacks[0]);
  ASSERT_NE(ema, nullptr);
  Trainer trainer(options);
  trainer.fit(model, train);
  EXPECT_EQ(ema->average_model()->n_averaged(), 12);  // steps 4..15
  EXPECT_TRUE(torch::equal(model.parameters()[0], ema->average_model()->tensors()[0]));
  EXPECT_FALSE(torch::equal(model.parameters()[0], trained[0]));
}

}  // namespace
}  // namespace fulgor::testing
