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

}  // namespace
