// Two ranks on loopback through gloo, started by fulgor-run.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/scenarios.h"
#include "support/spawn.h"

namespace {

TEST(Collectives, TwoRanksAllReduceAndBroadcast) {
  fulgor::test::TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks({"collectives", dir.str()}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;

  // Rank r contributed (r + 1, 10 (r + 1)); rank 1 broadcast r + 5 = 6.
  const std::vector<std::string> names = {"sum", "mean", "max", "min", "metric", "broadcast", "module"};
  auto rank0 = fulgor::test::load_tensors(dir / "collectives_rank0.pt", names);
  auto rank1 = fulgor::test::load_tensors(dir / "collectives_rank1.pt", names);
  torch::manual_seed(fulgor::test::init_seed(0));
  torch::nn::Linear linear0(3, 2);
  const torch::Tensor module0 = torch::cat({linear0->weight.reshape({-1}), linear0->bias}).detach();
  for (auto* ranks : {&rank0, &rank1}) {
    auto& r = *ranks;
    EXPECT_TRUE(r["sum"].equal(torch::tensor({3.0f, 30.0f}))) << r["sum"];
    EXPECT_TRUE(r["mean"].allclose(torch::tensor({1.5f, 15.0f}))) << r["mean"];
    EXPECT_TRUE(r["max"].equal(torch::tensor({2.0f, 20.0f}))) << r["max"];
    EXPECT_TRUE(r["min"].equal(torch::tensor({1.0f, 10.0f}))) << r["min"];
    EXPECT_DOUBLE_EQ(r["metric"].item<double>(), 0.75);  // mean of 0.5 and 1.0
    EXPECT_TRUE(r["broadcast"].equal(torch::full({3}, 6.0f))) << r["broadcast"];
    EXPECT_TRUE(r["module"].equal(module0)) << "rank 0's initial module everywhere";
  }
}

}  // namespace
