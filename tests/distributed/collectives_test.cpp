// Two ranks on loopback through gloo, started by fulgor-run.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/scenarios.h"
#include "support/spawn.h"

namespace {

TEST(Collectives, TwoRanksReduceGatherAndBroadcast) {
  fulgor::test::TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks({"collectives", dir.str()}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;

  // Rank r contributed (r + 1, 10 (r + 1)); rank 1 broadcast r + 5 = 6.
  const std::vector<std::string> names = {"sum",       "mean",           "max",           "min",
                                          "metric",    "broadcast",      "module",        "large",
                                          "scattered", "scattered_mean", "scattered_max", "scattered_bf16",
                                          "gathered",  "gathered_bf16"};
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
    // Rank r gave arange(4) + 10 r (and a quarter of it in bfloat16), and
    // (r + 1, r + 2) and (r + 0.5, r + 1.5) to gather.
    EXPECT_TRUE(r["gathered"].equal(torch::tensor({{1.0f, 2.0f}, {2.0f, 3.0f}}))) << r["gathered"];
    EXPECT_TRUE(r["gathered_bf16"].equal(torch::tensor({0.5f, 1.5f, 1.5f, 2.5f}))) << r["gathered_bf16"];
  }
  const auto part = [](std::vector<float> values) { return torch::tensor(values); };
  EXPECT_TRUE(rank0["scattered"].equal(part({10, 12}))) << rank0["scattered"];
  EXPECT_TRUE(rank1["scattered"].equal(part({14, 16}))) << rank1["scattered"];
  EXPECT_TRUE(rank0["scattered_mean"].equal(part({5, 6}).to(torch::kFloat64))) << rank0["scattered_mean"];
  EXPECT_TRUE(rank1["scattered_mean"].equal(part({7, 8}).to(torch::kFloat64))) << rank1["scattered_mean"];
  EXPECT_TRUE(rank0["scattered_max"].equal(part({10, 11}))) << rank0["scattered_max"];
  EXPECT_TRUE(rank1["scattered_max"].equal(part({12, 13}))) << rank1["scattered_max"];
  EXPECT_TRUE(rank0["scattered_bf16"].equal(part({2.5, 3}))) << rank0["scattered_bf16"];
  EXPECT_TRUE(rank1["scattered_bf16"].equal(part({3.5, 4}))) << rank1["scattered_bf16"];
  EXPECT_TRUE(rank0["large"].equal(torch::arange(500, torch::kFloat32) * 2 + 1000));
  EXPECT_TRUE(rank1["large"].equal(torch::arange(500, 1000, torch::kFloat32) * 2 + 1000));
  for (int rank : {0, 1}) {
    const std::string refused = fulgor::test::read_text(dir / ("refused_rank" + std::to_string(rank) + ".txt"));
    EXPECT_NE(refused.find("all_gather_into_tensor into a Float tensor of 3 elements is not accepted: it needs a "
                           "contiguous Float tensor of 4 elements"),
              std::string::npos)
        << refused;
  }
}

}  // namespace
