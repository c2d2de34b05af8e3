// Trainer.fit with strategy "ddp": two ranks on the CPU (gloo over loopback),
// started by fulgor-run or directly, checked against one process.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "fulgor/interop/torch_load.h"
#include "support/ddp_trainer_scenario.h"
#include "support/spawn.h"

namespace {

using namespace fulgor::test;

// Float32 gradients of 16 + 16 samples averaged over the ranks differ from
// those of one batch of 32 only by rounding (float32's relative 6e-8 on values
// of order 1, over 8 SGD steps at lr 0.1); a wrong average (a sum instead of
// a mean, or one rank's gradient alone) moves the parameters far more.
constexpr double kTolerance = 1e-6;

std::pair<std::optional<int>, std::string> run_with_fulgor_run(const std::vector<std::string>& args,
                                                               const std::string& log) {
  return run_two_ranks(FULGOR_DDP_TRAINER_WORKER, args, log, std::chrono::seconds(180));
}

std::vector<std::unique_ptr<Child>> start_ranks(std::vector<std::string> args, const TempDir& dir) {
  args.insert(args.begin(), FULGOR_DDP_TRAINER_WORKER);
  return start_two_ranks(args, dir.str());
}

std::map<std::string, double> metrics(const std::string& path) {
  std::map<std::string, double> result;
  std::ifstream in(path);
  std::string name;
  double value = 0;
  while (in >> name >> value) result[name] = value;
  return result;
}

int64_t files_under(const std::string& root) {
  namespace fs = std::filesystem;
  int64_t n = 0;
  if (fs::exists(root))
    for (const auto& entry : fs::recursive_directory_iterator(root)) n += entry.is_regular_file() ? 1 : 0;
  return n;
}

fulgor::TrainerOptions quiet(fulgor::TrainerOptions options) {
  options.logger = false;
  options.enable_checkpointing = false;
  options.enable_progress_bar = false;
  options.enable_model_summary = false;
  return options;
}

// The same training in this process: one rank, batches of 32 (the samples the
// two ranks' batches of 16 hold together), rank 0's initial model.
torch::Tensor train_in_one_process(const std::string& strategy, int64_t epochs, int64_t accumulate) {
  TempDir dir;
  RegressionNet model(init_seed(0));
  auto loader = make_loader(1, 0);
  auto options = quiet(ddp_options(dir.str(), epochs, accumulate));
  options.strategy = strategy;
  fulgor::Trainer trainer(options);
  trainer.fit(model, loader);
  EXPECT_EQ(trainer.world_size(), 1);
  EXPECT_EQ(trainer.global_rank(), 0);
  EXPECT_TRUE(trainer.is_global_zero());
  return flat_parameters(model);
}

// Runs two ranks of `fit` and checks the final parameters: the same on both
// ranks, and those of one process within kTolerance. Returns the gradients
// each rank held after each backward pass.
std::array<torch::Tensor, 2> expect_two_ranks_match_one_process(int64_t epochs, int64_t accumulate,
                                                                const std::string& mode = "fit") {
  TempDir dir;
  auto [status, log] =
      run_with_fulgor_run({mode, dir.str(), std::to_string(epochs), std::to_string(accumulate)}, dir / "log");
  EXPECT_TRUE(exited_with(status, 0)) << log;
  if (!exited_with(status, 0)) return {};
  const torch::Tensor rank0 = read_tensor(dir / "params_rank0.pt", "final");
  const torch::Tensor rank1 = read_tensor(dir / "params_rank1.pt", "final");
  EXPECT_TRUE(torch::equal(rank0, rank1)) << "the ranks' parameters differ";
  const torch::Tensor expected = train_in_one_process("single_device", epochs, accumulate);
  EXPECT_FALSE(torch::equal(expected, flat_parameters(*make_model(init_seed(0))))) << "training changed nothing";
  EXPECT_TRUE(torch::allclose(rank0, expected, 0, kTolerance))
      << "max difference " << (rank0 - expected).abs().max().item<double>();
  return {read_tensor(dir / "params_rank0.pt", "gradients"), read_tensor(dir / "params_rank1.pt", "gradients")};
}

TEST(DdpTrainer, TwoRanksOfSixteenMatchOneProcessOfThirtyTwo) {
  const auto gradients = expect_two_ranks_match_one_process(2, 1);
  ASSERT_TRUE(gradients[0].defined());
  ASSERT_EQ(gradients[0].size(0), 2 * kStepsPerEpoch);
  // Every backward pass steps the optimizer, so every one was averaged.
  EXPECT_TRUE(torch::equal(gradients[0], gradients[1])) << "a backward pass was not synchronized";
}

TEST(DdpTrainer, ManualBackwardAveragesGradientsOverTheRanks) {
  const auto gradients = expect_two_ranks_match_one_process(2, 1, "manual");
  ASSERT_TRUE(gradients[0].defined());
  ASSERT_EQ(gradients[0].size(0), 2 * kStepsPerEpoch);
  EXPECT_TRUE(torch::equal(gradients[0], gradients[1])) << "a manual_backward was not synchronized";
}

TEST(DdpTrainer, AccumulationCommunicatesOnlyOnSteppingBatches) {
  constexpr int64_t kAccumulate = 2;
  const auto gradients = expect_two_ranks_match_one_process(2, kAccumulate);
  ASSERT_TRUE(gradients[0].defined());
  ASSERT_EQ(gradients[0].size(0), 2 * kStepsPerEpoch);
  for (int64_t pass = 0; pass < gradients[0].size(0); ++pass) {
    const bool steps = (pass + 1) % kAccumulate == 0;
    // The ranks see different samples: their gradients agree only once averaged.
    EXPECT_EQ(torch::equal(gradients[0][pass], gradients[1][pass]), steps)
        << "backward pass " << pass << (steps ? " steps but was not averaged" : " does not step but communicated");
  }
}

TEST(DdpTrainer, SyncDistReducesOverTheRanks) {
  TempDir dir;
  auto [status, log] = run_with_fulgor_run({"fit", dir.str(), "1", "1"}, dir / "log");
  ASSERT_TRUE(exited_with(status, 0)) << log;
  for (int rank = 0; rank < 2; ++rank) {
    auto m = metrics(dir / ("metrics_rank" + std::to_string(rank) + ".txt"));
    EXPECT_EQ(m["global_rank"], rank);
    EXPECT_EQ(m["world_size"], 2);
    EXPECT_EQ(m["is_global_zero"], rank == 0 ? 1 : 0);
    // Ranks 0 and 1 log 1 and 2 on each of the epoch's steps.
    EXPECT_DOUBLE_EQ(m["rank_mean"], 1.5);
    EXPECT_DOUBLE_EQ(m["rank_sum"], 3.0 * kStepsPerEpoch);
    EXPECT_DOUBLE_EQ(m["rank_max"], 2.0);
    EXPECT_DOUBLE_EQ(m["rank_min"], 1.0);
    EXPECT_DOUBLE_EQ(m["rank_local"], rank + 1.0);
    // A logged metric's state summed over the ranks at the epoch's end.
    EXPECT_DOUBLE_EQ(m["rank_metric"], 1.75);
  }
}

// What a "shard" worker wrote: each epoch's training samples, and numbers.
struct ShardRun {
  std::map<int64_t, std::vector<int64_t>> trained_on;
  std::map<std::string, double> values;
  // From the rank's TorchSavePredictionWriter files: each sample's prediction
  // by its index (epoch file), and the batch files' count.
  std::map<int64_t, double> predicted;
  int64_t batch_files = 0;
};

void read_predictions(const std::filesystem::path& dir, int64_t rank, ShardRun& run) {
  const std::string r = std::to_string(rank);
  const c10::IValue predicted = fulgor::torch_load(dir / ("predictions_" + r + ".pt"));
  const c10::IValue batch_indices = fulgor::torch_load(dir / ("batch_indices_" + r + ".pt"));
  const auto& predictions = predicted.toListRef();
  const auto& indices = batch_indices.toListRef();
  ASSERT_EQ(predictions.size(), indices.size());
  for (size_t b = 0; b < predictions.size(); ++b) {
    std::vector<int64_t> ids;  // a Python list: generic, not typed
    for (const auto& id : indices[b].toListRef()) ids.push_back(id.toInt());
    const torch::Tensor values = predictions[b].toTensor();
    ASSERT_EQ(values.size(0), static_cast<int64_t>(ids.size()));
    for (size_t k = 0; k < ids.size(); ++k) run.predicted[ids[k]] = values[static_cast<int64_t>(k)].item<double>();
  }
  while (std::filesystem::exists(dir / ("predictions_" + r + "_" + std::to_string(run.batch_files) + ".pt")))
    ++run.batch_files;
}

ShardRun read_shard_run(const std::string& path) {
  ShardRun run;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    if (name.rfind("train", 0) == 0 && name != "train_batches") {
      auto& ids = run.trained_on[std::stoll(name.substr(5))];
      for (int64_t id; words >> id;) ids.push_back(id);
    } else {
      words >> run.values[name];
    }
  }
  return run;
}

std::array<ShardRun, 2> run_shard(bool use_distributed_sampler) {
  TempDir dir;
  auto [status, log] = run_with_fulgor_run({"shard", dir.str(), use_distributed_sampler ? "on" : "off"}, dir / "log");
  EXPECT_TRUE(exited_with(status, 0)) << log;
  std::array<ShardRun, 2> ranks{read_shard_run(dir / "shard_rank0.txt"), read_shard_run(dir / "shard_rank1.txt")};
  for (int64_t rank = 0; rank < 2; ++rank) read_predictions(dir / "predictions", rank, ranks[rank]);
  return ranks;
}

std::vector<int64_t> sorted(std::vector<int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<int64_t> range(int64_t n) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(i);
  return ids;
}

// The values over exactly the 7 validation samples i = 0..6 (ShardNet).
struct SevenSamples {
  double mean_square = 0, accuracy = 0;
  SevenSamples() {
    int64_t hits = 0;
    for (int64_t i = 0; i < 7; ++i) {
      mean_square += static_cast<double>(i * i) / 7;
      hits += ((i % 3 == 0) ? 1 : 0) == i % 2 ? 1 : 0;
    }
    accuracy = static_cast<double>(hits) / 7;
  }
};

// Plain TensorLoaders, sharded by the Trainer: each rank trains on half of
// each epoch's samples, the halves disjoint and new every epoch; validation
// (7 samples, 4 on rank 0 in batches of 3 and 1, 3 on rank 1 in one batch)
// counts every sample once in its sync_dist values and logged metrics.
TEST(DdpTrainer, ShardsPlainLoadersAndCountsEachValidationSampleOnce) {
  const auto ranks = run_shard(true);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const auto& mine0 = ranks[0].trained_on.at(epoch);
    const auto& mine1 = ranks[1].trained_on.at(epoch);
    EXPECT_EQ(mine0.size(), 8u) << "epoch " << epoch;
    EXPECT_EQ(mine1.size(), 8u) << "epoch " << epoch;
    std::vector<int64_t> together = mine0;
    together.insert(together.end(), mine1.begin(), mine1.end());
    EXPECT_EQ(sorted(together), range(16)) << "the ranks' samples of epoch " << epoch << " overlap";
  }
  EXPECT_NE(sorted(ranks[0].trained_on.at(0)), sorted(ranks[0].trained_on.at(1))) << "the same half every epoch";
  // Each rank wrote its own shard's predictions, with the samples' indices:
  // together every validation sample once.
  std::vector<int64_t> predicted;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(ranks[rank].batch_files, rank == 0 ? 2 : 1) << "rank " << rank;
    for (const auto& [index, value] : ranks[rank].predicted) {
      predicted.push_back(index);
      EXPECT_EQ(value, 10.0 * static_cast<double>(index)) << "rank " << rank << " sample " << index;
    }
  }
  EXPECT_EQ(sorted(predicted), range(7));
  const SevenSamples expected;
  for (int rank = 0; rank < 2; ++rank) {
    const auto& v = ranks[rank].values;
    EXPECT_EQ(v.at("train_batches"), 2) << "rank " << rank;
    EXPECT_EQ(v.at("val_batches"), rank == 0 ? 2 : 1) << "rank " << rank;
    for (const char* when : {"fit_", "validate_"}) {
      const std::string at = std::string(when) + " on rank " + std::to_string(rank);
      EXPECT_NEAR(v.at(std::string(when) + "val_square"), expected.mean_square, 1e-12) << at;
      EXPECT_DOUBLE_EQ(v.at(std::string(when) + "val_count"), 7) << at;
      EXPECT_DOUBLE_EQ(v.at(std::string(when) + "val_max"), 6) << at;
      EXPECT_DOUBLE_EQ(v.at(std::string(when) + "val_local_count"), rank == 0 ? 4 : 3) << at;
      EXPECT_NEAR(v.at(std::string(when) + "val_acc"), expected.accuracy, 1e-6) << at;
    }
  }
}

TEST(DdpTrainer, UseDistributedSamplerFalseLeavesLoadersWhole) {
  const auto ranks = run_shard(false);
  for (int rank = 0; rank < 2; ++rank) {
    for (int64_t epoch = 0; epoch < 2; ++epoch)
      EXPECT_EQ(sorted(ranks[rank].trained_on.at(epoch)), range(16)) << "rank " << rank << ", epoch " << epoch;
    const auto& v = ranks[rank].values;
    EXPECT_EQ(v.at("train_batches"), 4);
    EXPECT_EQ(v.at("val_batches"), 3);
    EXPECT_DOUBLE_EQ(v.at("fit_val_count"), 14) << "both ranks validate on all 7 samples";
    EXPECT_DOUBLE_EQ(v.at("fit_val_local_count"), 7);
  }
}

TEST(DdpTrainer, OnlyRankZeroWritesFilesAndPrints) {
  TempDir dir;
  auto ranks = start_ranks({"fit", dir.str(), "1", "1"}, dir);
  for (int rank = 0; rank < 2; ++rank)
    ASSERT_TRUE(exited_with(ranks[rank]->wait(std::chrono::seconds(120)), 0)) << ranks[rank]->log();
  EXPECT_GT(files_under(dir / "rank0/checkpoints"), 0) << "rank 0 saved no checkpoint";
  EXPECT_GT(files_under(dir / "rank0/lightning_logs"), 0) << "rank 0 wrote no logs";
  EXPECT_EQ(files_under(dir / "rank1"), 0) << "rank 1 wrote files";
  const std::string log0 = ranks[0]->log(), log1 = ranks[1]->log();
  EXPECT_NE(log0.find("Epoch 1/1"), std::string::npos) << "rank 0 showed no progress: " << log0;
  EXPECT_NE(log0.find("Total params"), std::string::npos) << "rank 0 printed no model summary: " << log0;
  EXPECT_EQ(log1.find("Epoch"), std::string::npos) << "rank 1 showed progress: " << log1;
  EXPECT_EQ(log1.find("Total params"), std::string::npos) << "rank 1 printed a model summary: " << log1;
}

// Ranks that log a monitored metric without sync_dist disagree on whether it
// improved. A save is a collective, so a rank saving alone would wait at its
// barrier while the others went on to their next collective (gloo aborts the
// job); ModelCheckpoint saves only where every rank's values call for it.
TEST(DdpTrainer, CheckpointSavesAreDecidedTogether) {
  TempDir dir;
  auto [status, log] = run_with_fulgor_run({"disagree", dir.str()}, dir / "log");
  ASSERT_TRUE(exited_with(status, 0)) << log;
  // Rank 0's metric worsens (0, 1, 2) and rank 1's improves (0, -1, -2): only
  // the first epoch's save is unanimous.
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "checkpoints"))
    files.insert(entry.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"epoch=0.ckpt"}));
}

// From a path, and from "last" (Note [Resolving "last"]), which rank 0
// resolves for every rank: in "resume_last" only rank 0's folder holds it.
TEST(DdpTrainer, ResumingMidEpochContinuesExactly) {
  constexpr int64_t kEpochs = 3;
  TempDir uninterrupted;
  auto [status, log] =
      run_with_fulgor_run({"fit", uninterrupted.str(), std::to_string(kEpochs), "1"}, uninterrupted / "log");
  ASSERT_TRUE(exited_with(status, 0)) << log;
  for (const char* mode : {"resume", "resume_last"}) {
    SCOPED_TRACE(mode);
    TempDir resumed;
    auto [status2, log2] = run_with_fulgor_run({mode, resumed.str(), std::to_string(kEpochs), "1"}, resumed / "log");
    ASSERT_TRUE(exited_with(status2, 0)) << log2;
    for (const char* rank : {"0", "1"}) {
      const std::string name = std::string("params_rank") + rank + ".pt";
      EXPECT_TRUE(torch::equal(read_tensor(uninterrupted / name, "final"), read_tensor(resumed / name, "final")))
          << "rank " << rank;
      // The resumed Trainer ran the rest of epoch 2 (2 batches) and epoch 3 (4).
      EXPECT_EQ(read_tensor(resumed / name, "gradients").size(0), kStepsPerEpoch / 2 + kStepsPerEpoch)
          << "rank " << rank;
    }
    EXPECT_EQ(log2.find("no last checkpoint"), std::string::npos) << log2;
  }
}

// Rank 1 dies (SIGKILL) or stops answering (SIGSTOP) in its third training
// step; rank 0 must fail in the Trainer with a DistributedError naming it.
std::string survivor_log(const std::string& how) {
  TempDir dir;
  auto ranks = start_ranks({"die", dir.str(), how}, dir);
  // ddp_timeout is 10 s (room for a slow start under load); the bound only
  // keeps a hang from stalling the suite.
  const auto status = ranks[0]->wait(std::chrono::seconds(90));
  const std::string log = ranks[0]->log();
  EXPECT_TRUE(status.has_value()) << "rank 0 hung: " << log;
  EXPECT_TRUE(exited_with(status, 3)) << "rank 0 did not fail with a fulgor::Error: " << log;
  EXPECT_NE(log.find("failed on rank 0 of 2"), std::string::npos) << log;
  return log;  // rank 1 is killed and reaped with its Child
}

TEST(DdpTrainer, KilledRankMakesTheOtherFail) {
  const std::string log = survivor_log("kill");
  EXPECT_NE(log.find("rank 1 is gone: its connection closed"), std::string::npos) << log;
}

TEST(DdpTrainer, StoppedRankMakesTheOtherTimeOut) {
  const std::string log = survivor_log("stop");
  EXPECT_NE(log.find("rank 1 did not arrive within the timeout of 10000 ms, which ddp_timeout sets"),
            std::string::npos)
      << log;
}

// A rank that stops makes the other fail within ddp_timeout and a bounded
// slack; fulgor-run then restarts both, which resume from last.ckpt (the
// first epoch's) and end where an uninterrupted fit ends.
TEST(DdpTrainer, AStoppedRankIsRestartedByTheLauncherAndTheFitEndsAsUninterrupted) {
  TempDir uninterrupted, restarted;
  auto [status, log] = run_with_fulgor_run({"fit", uninterrupted.str(), "3", "1"}, uninterrupted / "log");
  ASSERT_TRUE(exited_with(status, 0)) << log;
  Child run({FULGOR_RUN_PATH, "--nproc-per-node", "2", "--max-restarts", "1", "--grace-period", "1", "--",
             FULGOR_DDP_TRAINER_WORKER, "stop_once", restarted.str(), "3", "1"},
            {}, restarted / "log");
  const auto status2 = run.wait(std::chrono::seconds(180));
  const std::string log2 = run.log();
  ASSERT_TRUE(exited_with(status2, 0)) << log2;
  EXPECT_NE(log2.find("rank 1 did not arrive within the timeout of 5000 ms, which ddp_timeout sets"),
            std::string::npos)
      << log2;
  EXPECT_NE(log2.find("restarting the 2 ranks of this node (restart 1 of --max-restarts 1)"), std::string::npos)
      << log2;
  for (const char* rank : {"0", "1"}) {
    const std::string name = std::string("params_rank") + rank + ".pt";
    EXPECT_TRUE(torch::equal(read_tensor(uninterrupted / name, "final"), read_tensor(restarted / name, "final")))
        << "rank " << rank;
    // The restarted ranks ran epochs 2 and 3 only.
    EXPECT_EQ(read_tensor(restarted / name, "gradients").size(0), 2 * kStepsPerEpoch) << "rank " << rank;
  }
}

TEST(DdpTrainer, DdpWithoutALauncherTrainsAlone) {
  // A job of one: strategy "ddp" gives exactly the single-device result.
  EXPECT_TRUE(torch::equal(train_in_one_process("ddp", 1, 1), train_in_one_process("single_device", 1, 1)));
}

TEST(DdpTrainer, BadTimeoutIsAConfigError) {
  TempDir dir;
  RegressionNet model(init_seed(0));
  auto loader = make_loader(1, 0);
  auto options = quiet(ddp_options(dir.str(), 1, 1));
  options.ddp_timeout = 0.0;
  fulgor::Trainer trainer(options);
  try {
    trainer.fit(model, loader);
    FAIL() << "ddp_timeout=0 was accepted";
  } catch (const fulgor::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ddp_timeout=0"), std::string::npos) << e.what();
  }
}

}  // namespace
