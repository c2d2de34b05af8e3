// Fabric under ddp: two ranks of the CPU (gloo over loopback), launched by
// Fabric itself or by fulgor-run, train exactly as the Trainer's ddp does on
// the same data.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>

#include "../distributed/support/spawn.h"

namespace {

using fulgor::test::Child;
using fulgor::test::TempDir;

torch::Tensor final_parameters(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::Tensor t;
  archive.read("final", t);
  return t;
}

std::map<std::string, std::string> fields(const std::string& path) {
  std::map<std::string, std::string> result;
  std::ifstream in(path);
  std::string key, value;
  while (in >> key >> value) result[key] = value;
  return result;
}

void run_trainer(const TempDir& dir, int64_t epochs, int64_t accumulate) {
  auto [status, log] = fulgor::test::run_two_ranks(
      FULGOR_FABRIC_WORKER, {"trainer", dir.str(), std::to_string(epochs), std::to_string(accumulate)},
      dir / "trainer.log", std::chrono::seconds(180));
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
}

// Both ranks' parameters after Fabric's loop equal the Trainer's, bit for bit.
void expect_fabric_equals_trainer(const TempDir& dir) {
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    const torch::Tensor fabric = final_parameters(dir / ("fabric_rank" + r + ".pt"));
    const torch::Tensor trainer = final_parameters(dir / ("trainer_rank" + r + ".pt"));
    EXPECT_TRUE(torch::equal(fabric, trainer))
        << "rank " << r << ": max difference " << (fabric - trainer).abs().max().item<double>();
  }
}

TEST(FabricDdp, LaunchedByFabricItselfTrainsAsTheTrainersDdp) {
  TempDir dir;
  // Run once, as a user runs a program: Fabric starts rank 1 itself.
  Child program({FULGOR_FABRIC_WORKER, "fabric", dir.str(), "2", "1"}, {}, dir / "fabric.log");
  const auto status = program.wait(std::chrono::seconds(180));
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << program.log();
  run_trainer(dir, 2, 1);
  expect_fabric_equals_trainer(dir);
  for (int rank = 0; rank < 2; ++rank) {
    auto f = fields(dir / ("fabric_rank" + std::to_string(rank) + ".txt"));
    EXPECT_EQ(f["world_size"], "2");
    EXPECT_EQ(f["global_rank"], std::to_string(rank));
    EXPECT_EQ(f["strategy"], "ddp");
    EXPECT_EQ(f["mean"], "1.5") << "the ranks' 1 and 2 averaged";
    EXPECT_EQ(f["gathered_rows"], "2");
    EXPECT_EQ(f["gathered_1"], "1") << "row 1 is rank 1's";
    EXPECT_EQ(f["broadcast"], "6") << "rank 1's value, broadcast from rank 1";
    EXPECT_EQ(f["message_from"], "0");
    EXPECT_EQ(f["nested"], "3") << "a map of vectors of tensors, summed";
    EXPECT_EQ(f["group_sum"], "3") << "a group of both ranks";
    EXPECT_EQ(f["alone"], rank == 1 ? "1" : "0") << "only the members get the group";
    EXPECT_EQ(f["alone_sum"], rank == 1 ? "2" : "0");
    EXPECT_EQ(f["saw_first"], "1") << "rank 1's turn came after rank 0's";
  }
}

TEST(FabricDdp, NoBackwardSyncAccumulatesAsTheTrainer) {
  TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks(FULGOR_FABRIC_WORKER, {"fabric", dir.str(), "2", "2"},
                                                   dir / "fabric.log", std::chrono::seconds(180));
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  run_trainer(dir, 2, 2);
  expect_fabric_equals_trainer(dir);
}

void run_adam(const TempDir& dir, const std::string& load) {
  auto [status, log] = fulgor::test::run_two_ranks(FULGOR_FABRIC_WORKER, {"adam", dir.str(), "3", load},
                                                   dir / ("adam_" + load + ".log"), std::chrono::seconds(180));
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
}

// A 2-rank run resumed from its epoch-1 checkpoint, loaded after setup (as
// docs/ways_in.md shows) or before it, ends with the uninterrupted run's
// parameters on both ranks, bit for bit.
TEST(FabricDdp, ResumedRunEqualsTheUninterruptedOneOnEveryRank) {
  TempDir dir;
  run_adam(dir, "none");
  for (const std::string load : {"after_setup", "before_setup"}) {
    run_adam(dir, load);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string r = std::to_string(rank);
      const torch::Tensor resumed = final_parameters(dir / ("adam_" + load + "_rank" + r + ".pt"));
      const torch::Tensor uninterrupted = final_parameters(dir / ("adam_none_rank" + r + ".pt"));
      EXPECT_TRUE(torch::equal(resumed, uninterrupted))
          << load << ", rank " << r << ": max difference " << (resumed - uninterrupted).abs().max().item<double>();
    }
  }
}

// Ranks that load different checkpoints are stopped at the load, not trained apart.
TEST(FabricDdp, RanksLoadingDifferentStatesAreAnError) {
  TempDir dir;
  run_adam(dir, "none");
  auto [status, log] = fulgor::test::run_two_ranks(FULGOR_FABRIC_WORKER, {"adam", dir.str(), "3", "apart"},
                                                   dir / "apart.log", std::chrono::seconds(180));
  EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << log;
  EXPECT_NE(log.find("the parameters after Fabric::load('" + (dir / "epoch")), std::string::npos) << log;
  EXPECT_NE(log.find("differ across the 2 ranks (4 of 4, the first '0.weight')"), std::string::npos) << log;
}

// loss.backward() leaves the gradients local: the optimizer must not step on them.
TEST(FabricDdp, LossBackwardInsteadOfFabricBackwardIsNamed) {
  TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks(FULGOR_FABRIC_WORKER, {"plain_backward", dir.str(), "1", "1"},
                                                   dir / "log", std::chrono::seconds(180));
  EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << log;
  EXPECT_NE(log.find("under ddp, call fabric.backward(loss) instead of loss.backward()"), std::string::npos) << log;
}

}  // namespace
