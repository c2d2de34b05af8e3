// GradientAccumulationScheduler, as Lightning's.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <vector>

#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

// The optimizer steps of each epoch.
std::shared_ptr<LambdaCallback> counting_steps(std::map<int64_t, int64_t>& steps) {
  LambdaHooks h;
  h.on_before_optimizer_step = [&steps](Trainer& t, ModuleBase&, torch::optim::Optimizer&) {
    ++steps[t.current_epoch()];
  };
  return std::make_shared<LambdaCallback>(h);
}

TEST(GradientAccumulationScheduler, ChangesTheFactorAtTheScheduledEpochs) {
  TempDir dir;
  auto train = sequential_loader(32, 4);  // 8 batches an epoch
  std::map<int64_t, int64_t> steps;
  auto accumulation = std::make_shared<GradientAccumulationScheduler>(std::map<int64_t, int64_t>{{1, 2}, {3, 4}});
  EXPECT_EQ(accumulation->get_accumulate_grad_batches(0), 1);  // epoch 0 added with factor 1
  EXPECT_EQ(accumulation->get_accumulate_grad_batches(2), 2);
  EXPECT_EQ(accumulation->get_accumulate_grad_batches(9), 4);
  EXPECT_TRUE(accumulation->going_to_accumulate_grad_batches());
  TinyNet model;
  Trainer trainer(quiet(dir, 4, {accumulation, counting_steps(steps)}));
  auto result = trainer.fit(model, train);
  EXPECT_EQ(steps, (std::map<int64_t, int64_t>{{0, 8}, {1, 4}, {2, 4}, {3, 2}}));
  EXPECT_EQ(result.global_step, 18);
  EXPECT_EQ(trainer.accumulate_grad_batches(), 4);
}

// The scheduled factor accumulates as the option does: same weights.
TEST(GradientAccumulationScheduler, AccumulatesAsTheOptionDoes) {
  TempDir dir;
  auto train = sequential_loader(24, 4);
  torch::manual_seed(5);
  TinyNet scheduled;
  torch::manual_seed(5);
  TinyNet option;
  Trainer a(quiet(dir, 1, {std::make_shared<GradientAccumulationScheduler>(std::map<int64_t, int64_t>{{0, 3}})}));
  a.fit(scheduled, train);
  auto o = quiet(dir, 1);
  o.accumulate_grad_batches = 3;
  Trainer b(o);
  b.fit(option, train);
  EXPECT_TRUE(same_parameters(scheduled, option));
  EXPECT_EQ(a.global_step(), 2);
}

TEST(GradientAccumulationScheduler, RefusesWhatLightningRefuses) {
  using Schedule = std::map<int64_t, int64_t>;
  EXPECT_THROW(GradientAccumulationScheduler(Schedule{}), ConfigError);
  EXPECT_THROW(GradientAccumulationScheduler(Schedule{{-1, 2}}), ConfigError);
  EXPECT_THROW(GradientAccumulationScheduler(Schedule{{2, 0}}), ConfigError);
  TempDir dir;
  auto train = sequential_loader(8, 4);
  auto o = quiet(dir, 1, {std::make_shared<GradientAccumulationScheduler>(Schedule{{1, 2}})});
  o.accumulate_grad_batches = 2;
  TinyNet model;
  Trainer both(o);
  try {
    both.fit(model, train);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("accumulate_grad_batches=2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Trainer(quiet(dir, 1)).set_accumulate_grad_batches(0), ConfigError);
}

}  // namespace
}  // namespace fulgor::testing
