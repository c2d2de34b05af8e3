// Trainer.fit with strategy "ddp": two ranks on the CPU (gloo over loopback),
// started by fulgor-run, checked against one process.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "support/ddp_trainer_scenario.h"
#include "support/spawn.h"

namespace {

using namespace fulgor::test;

// Float32 gradients summed over 16 + 16 samples and averaged over the ranks
// differ from those of one batch of 32 only by rounding; over 8 SGD steps at
// lr 0.1 that stays far below 1e-5.
constexpr double kTolerance = 1e-5;

std::pair<std::optional<int>, std::string> run_trainer_ranks(const std::vector<std::string>& args,
                                                             const std::string& log) {
  std::vector<std::string> argv = {FULGOR_RUN_PATH, "--nproc-per-node", "2", "--", FULGOR_DDP_TRAINER_WORKER};
  argv.insert(argv.end(), args.begin(), args.end());
  Child launcher(argv, {}, log);
  std::optional<int> status = launcher.wait(std::chrono::seconds(180));
  return {status, launcher.log()};
}

torch::Tensor final_parameters(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::Tensor t;
  archive.read("final", t);
  return t;
}

std::map<std::string, double> metrics(const std::string& path) {
  std::map<std::string, double> result;
  std::ifstream in(path);
  std::string name;
  double value = 0;
  while (in >> name >> value) result[name] = value;
  return result;
}

// The same training in this process: one rank, batches of 32 (the same
// samples the two ranks' batches of 16 hold together), rank 0's initial model.
torch::Tensor single_process(int64_t epochs, int64_t accumulate) {
  TempDir dir;
  RegressionNet model(init_seed(0));
  auto loader = make_loader(1, 0);
  auto options = ddp_options(dir.str(), epochs, accumulate);
  options.strategy = "single_device";
  options.logger = false;
  options.enable_checkpointing = false;
  fulgor::Trainer trainer(options);
  trainer.fit(model, loader);
  EXPECT_EQ(trainer.world_size(), 1);
  return flat_parameters(model);
}

void expect_two_ranks_match_one_process(int64_t accumulate) {
  constexpr int64_t kEpochs = 2;
  TempDir dir;
  auto [status, log] =
      run_trainer_ranks({"fit", dir.str(), std::to_string(kEpochs), std::to_string(accumulate)}, dir / "log");
  ASSERT_TRUE(exited_with(status, 0)) << log;
  const torch::Tensor rank0 = final_parameters(dir / "params_rank0.pt");
  const torch::Tensor rank1 = final_parameters(dir / "params_rank1.pt");
  EXPECT_TRUE(torch::equal(rank0, rank1)) << "the ranks' parameters differ";
  const torch::Tensor expected = single_process(kEpochs, accumulate);
  EXPECT_FALSE(torch::equal(expected, flat_parameters(*make_model(init_seed(0))))) << "training changed nothing";
  EXPECT_TRUE(torch::allclose(rank0, expected, 0, kTolerance))
      << "max difference " << (rank0 - expected).abs().max().item<double>();
}

TEST(DdpTrainer, TwoRanksOfSixteenMatchOneProcessOfThirtyTwo) { expect_two_ranks_match_one_process(1); }

TEST(DdpTrainer, AccumulatedGradientsMatchOneProcess) { expect_two_ranks_match_one_process(2); }

TEST(DdpTrainer, SyncDistReducesOverRanksAndOnlyRankZeroWrites) {
  TempDir dir;
  auto [status, log] = run_trainer_ranks({"fit", dir.str(), "1", "1"}, dir / "log");
  ASSERT_TRUE(exited_with(status, 0)) << log;
  for (int rank = 0; rank < 2; ++rank) {
    auto m = metrics(dir / ("metrics_rank" + std::to_string(rank) + ".txt"));
    EXPECT_EQ(m["global_rank"], rank);
    EXPECT_EQ(m["world_size"], 2);
    EXPECT_EQ(m["is_global_zero"], rank == 0 ? 1 : 0);
    // Ranks log 1 and 2 on each of the epoch's steps.
    EXPECT_DOUBLE_EQ(m["rank_mean"], 1.5);
    EXPECT_DOUBLE_EQ(m["rank_sum"], 3.0 * kStepsPerEpoch);
    EXPECT_DOUBLE_EQ(m["rank_max"], 2.0);
    EXPECT_DOUBLE_EQ(m["rank_min"], 1.0);
    EXPECT_DOUBLE_EQ(m["rank_local"], rank + 1.0);
  }
  namespace fs = std::filesystem;
  auto files_under = [](const std::string& root) {
    int64_t n = 0;
    if (fs::exists(root))
      for (const auto& entry : fs::recursive_directory_iterator(root)) n += entry.is_regular_file() ? 1 : 0;
    return n;
  };
  EXPECT_GT(files_under(dir / "rank0/checkpoints"), 0) << "rank 0 saved no checkpoint";
  EXPECT_GT(files_under(dir / "rank0/lightning_logs"), 0) << "rank 0 wrote no logs";
  EXPECT_EQ(files_under(dir / "rank1"), 0) << "rank 1 wrote files";
}

TEST(DdpTrainer, ResumingContinuesExactly) {
  constexpr int64_t kEpochs = 3;
  TempDir uninterrupted, resumed;
  auto [status, log] = run_trainer_ranks({"fit", uninterrupted.str(), std::to_string(kEpochs), "1"},
                                         uninterrupted / "log");
  ASSERT_TRUE(exited_with(status, 0)) << log;
  auto [status2, log2] = run_trainer_ranks({"resume", resumed.str(), std::to_string(kEpochs), "1"}, resumed / "log");
  ASSERT_TRUE(exited_with(status2, 0)) << log2;
  for (const char* rank : {"0", "1"}) {
    const std::string name = std::string("params_rank") + rank + ".pt";
    EXPECT_TRUE(torch::equal(final_parameters(uninterrupted / name), final_parameters(resumed / name)))
        << "rank " << rank;
  }
}

}  // namespace
