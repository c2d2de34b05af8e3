// Gradient synchronization between two ranks, checked against one process.

#include "fulgor/distributed/gradient_sync.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/scenarios.h"
#include "support/spawn.h"

namespace {

using fulgor::test::kGlobalBatch;

torch::Tensor flat(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.detach().reshape({-1}));
  return torch::cat(parts).clone();
}

std::vector<torch::Tensor> grads(torch::nn::Module& module) {
  std::vector<torch::Tensor> result;
  for (const auto& p : module.parameters()) result.push_back(p.grad());
  return result;
}

// Float32 sums over 16 + 16 samples and over 32 samples differ only by
// rounding; after 5 steps of SGD at lr 0.1 that stays far below 1e-5.
constexpr double kSyncTolerance = 1e-5;

TEST(GradientSync, TwoRanksOfSixteenMatchOneProcessOfThirtyTwo) {
  constexpr int64_t kSteps = 5;
  fulgor::test::TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks({"train", dir.str(), std::to_string(kSteps)}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  const std::vector<std::string> names = {"initial", "final", "buckets", "reductions"};
  auto rank0 = fulgor::test::load_tensors(dir / "train_rank0.pt", names);
  auto rank1 = fulgor::test::load_tensors(dir / "train_rank1.pt", names);

  // The reference: one process, rank 0's initial model, the whole batch of 32.
  auto model = fulgor::test::make_model(fulgor::test::init_seed(0));
  auto [x, y] = fulgor::test::make_data(kSteps);
  torch::optim::SGD optimizer(model->parameters(), fulgor::test::kLearningRate);
  const torch::Tensor initial = flat(model->parameters());
  for (int64_t step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x.narrow(0, step * kGlobalBatch, kGlobalBatch)),
                    y.narrow(0, step * kGlobalBatch, kGlobalBatch))
        .backward();
    optimizer.step();
  }
  const torch::Tensor expected = flat(model->parameters());

  EXPECT_TRUE(rank0["initial"].equal(initial)) << "rank 0 keeps its own initial parameters";
  EXPECT_TRUE(rank1["initial"].equal(initial)) << "rank 1 starts from rank 0's parameters";
  EXPECT_FALSE(expected.allclose(initial)) << "training moved the parameters";
  EXPECT_TRUE(rank0["final"].allclose(expected, 0, kSyncTolerance))
      << "max difference " << (rank0["final"] - expected).abs().max().item<double>();
  EXPECT_TRUE(rank0["final"].equal(rank1["final"])) << "both ranks hold identical parameters";
  EXPECT_GT(rank0["buckets"].item<int64_t>(), 1) << "the small bucket cap splits the gradients";
  EXPECT_EQ(rank0["reductions"].item<int64_t>(), kSteps * rank0["buckets"].item<int64_t>());
}

TEST(GradientSync, NoSyncAccumulatesLocallyUntilTheSynchronizedStep) {
  fulgor::test::TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks({"nosync", dir.str()}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  const std::vector<std::string> names = {"local", "synced", "reductions_before", "reductions_after", "buckets"};
  auto rank0 = fulgor::test::load_tensors(dir / "nosync_rank0.pt", names);
  auto rank1 = fulgor::test::load_tensors(dir / "nosync_rank1.pt", names);

  // Per rank, from rank 0's initial model: micro-batches 0 and 1 accumulated
  // locally, then micro-batch 0 again in the synchronized step.
  auto [x, y] = fulgor::test::make_data(1);
  std::vector<torch::Tensor> local, accumulated;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto model = fulgor::test::make_model(fulgor::test::init_seed(0));
    const auto batch = [&](int64_t m) { return rank * 16 + m * 8; };
    for (int64_t m : {0, 1})
      torch::mse_loss(model->forward(x.narrow(0, batch(m), 8)), y.narrow(0, batch(m), 8)).backward();
    local.push_back(flat(grads(*model)));
    torch::mse_loss(model->forward(x.narrow(0, batch(0), 8)), y.narrow(0, batch(0), 8)).backward();
    accumulated.push_back(flat(grads(*model)));
  }
  const torch::Tensor mean = (accumulated[0] + accumulated[1]) / 2;

  EXPECT_EQ(rank0["reductions_before"].item<int64_t>(), 0) << "no_sync steps started no all_reduce";
  EXPECT_EQ(rank1["reductions_before"].item<int64_t>(), 0);
  EXPECT_EQ(rank0["reductions_after"].item<int64_t>(), rank0["buckets"].item<int64_t>());
  EXPECT_TRUE(rank0["local"].allclose(local[0], 0, kSyncTolerance)) << "rank 0 kept its own gradients";
  EXPECT_TRUE(rank1["local"].allclose(local[1], 0, kSyncTolerance)) << "rank 1 kept its own gradients";
  EXPECT_FALSE(rank0["local"].allclose(rank1["local"])) << "gradients differ between ranks until synced";
  EXPECT_TRUE(rank0["synced"].equal(rank1["synced"])) << "identical after the synchronized step";
  EXPECT_TRUE(rank0["synced"].allclose(mean, 0, kSyncTolerance))
      << "the mean of everything accumulated: max difference " << (rank0["synced"] - mean).abs().max().item<double>();
}

// Note [A parameter's storage replaced]: before the hooks moved, each rank
// kept its own gradients here.
TEST(GradientSync, AveragesParametersWhoseStorageWasReplaced) {
  fulgor::test::TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks({"storage_replaced", dir.str()}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  const auto rank0 = fulgor::test::load_tensors(dir / "storage_replaced_rank0.pt", {"grads"});
  const auto rank1 = fulgor::test::load_tensors(dir / "storage_replaced_rank1.pt", {"grads"});

  auto model = fulgor::test::make_model(fulgor::test::init_seed(0));
  auto [x, y] = fulgor::test::make_data(1);
  torch::mse_loss(model->forward(x), y).backward();
  const torch::Tensor expected = flat(grads(*model));
  EXPECT_TRUE(rank0.at("grads").equal(rank1.at("grads"))) << "both ranks hold the averaged gradients";
  EXPECT_TRUE(rank0.at("grads").allclose(expected, 0, kSyncTolerance))
      << "max difference " << (rank0.at("grads") - expected).abs().max().item<double>();
}

// Note [Parameters some rank did not reach]: a parameter one rank reached
// (with a zero gradient) and the other did not is stepped on both.
TEST(GradientSync, AParameterOneRankDidNotReachIsSteppedOnEveryRank) {
  fulgor::test::TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks({"unreached", dir.str()}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  const std::vector<std::string> names = {"after_first", "final", "has_gradient"};
  const auto rank0 = fulgor::test::load_tensors(dir / "unreached_rank0.pt", names);
  const auto rank1 = fulgor::test::load_tensors(dir / "unreached_rank1.pt", names);
  EXPECT_TRUE(rank0.at("has_gradient").item<bool>());
  EXPECT_TRUE(rank1.at("has_gradient").item<bool>()) << "the rank that did not reach it gets the zeros too";
  EXPECT_TRUE(rank0.at("final").equal(rank1.at("final"))) << "the ranks parted";
  EXPECT_FALSE(rank1.at("final").equal(rank1.at("after_first"))) << "Adam's momentum steps it";
}

// Note [Ranks in step]: ranks out of step end in an error naming what differs.
TEST(GradientSync, RanksOutOfStepAreAnError) {
  const std::pair<const char*, const char*> cases[] = {
      {"parameters",
       "the parameters after a deliberate change differ across the 2 ranks (1 of 4, the first '2.weight')"},
      {"replaced",
       "the averaged gradients of the first synchronized step after set-up differ across the 2 ranks (1 of 1, the "
       "first 'w')"}};
  for (const auto& [mode, message] : cases) {
    fulgor::test::TempDir dir;
    auto [status, log] = fulgor::test::run_two_ranks({"out_of_step", dir.str(), mode}, dir / "log");
    EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << mode << ": " << log;
    EXPECT_NE(log.find(message), std::string::npos) << mode << ": " << log;
  }
}

}  // namespace
