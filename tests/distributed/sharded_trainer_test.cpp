// Trainer.fit under the sharded strategies (fsdp's FULL_SHARD, SHARD_GRAD_OP
// and NO_SHARD, ddp's zero_redundancy_optimizer) on 2 and 4 CPU ranks, checked
// against the same fit under ddp, against itself interrupted and resumed, and
// through its checkpoints in one process.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fulgor/interop/distributed_checkpoint.h"
#include "fulgor/interop/state_dict.h"
#include "fulgor/interop/torch_save.h"
#include "fulgor/precision/precision.h"
#include "support/sharded_scenario.h"
#include "support/spawn.h"

namespace {

using namespace fulgor::test;

// Float64 fits of 6 (adam) or 12 (sgd) steps. The ranks' mean gradient is
// the one ddp computes (halving and quartering are exact), and the shards
// are stepped elementwise, so what is left is the clipping norm summed in
// another order and vectorized kernels rounding a piece's elements apart
// from the whole parameter's: a few units in the last place.
constexpr double kRelative = 1e-12;

std::vector<std::string> two_rank_variants() {
  return {"ddp_adam",
          "ddp_sgd",
          "zero1_adam",
          "zero1_sgd",
          "shard_grad_op_adam",
          "shard_grad_op_sgd",
          "full_shard_adam",
          "full_shard_sgd",
          "full_shard_ckpt_adam",
          "full_shard_ckpt_sgd",
          "no_shard_adam",
          "zero1_adam_resumed",
          "shard_grad_op_adam_resumed",
          "shard_grad_op_sgd_resumed",
          "full_shard_adam_resumed",
          "full_shard_sgd_resumed",
          "full_shard_ckpt_adam_resumed",
          "ddp_dcp_adam_resumed",
          "zero1_dcp_adam_resumed",
          "shard_grad_op_dcp_sgd_resumed",
          "full_shard_dcp_adam_resumed",
          "full_shard_dcp_sgd_resumed",
          "full_shard_keep_adam",
          "ddp_spike_sgd",
          "zero1_spike_sgd",
          "shard_grad_op_spike_sgd",
          "ddp_bf16_adam",
          "shard_grad_op_bf16_adam",
          "full_shard_bf16_adam",
          "full_shard_bf16_adam_resumed",
          "ddp_wide_sgd",
          "full_shard_wide_sgd",
          "full_shard_wide_sgd_resumed"};
}

// 2 nodes of 2 ranks: the 4-rank job's data and world size.
std::vector<std::string> hybrid_variants() {
  return {"hybrid_shard_adam", "hybrid_shard_sgd", "hybrid_shard_adam_resumed", "hybrid_shard_dcp_sgd_resumed"};
}

// The variants' parameters on every rank, read from the files the ranks wrote.
std::map<std::string, torch::Tensor> read_ranks(int ranks, const TempDir& dir,
                                                const std::vector<std::string>& variants) {
  std::map<std::string, torch::Tensor> params;
  for (int rank = 0; rank < ranks; ++rank) {
    torch::serialize::InputArchive archive;
    archive.load_from(dir / ("params_rank" + std::to_string(rank) + ".pt"));
    for (const std::string& full : variants) {
      const ShardedVariant variant = parse_variant(full);
      const std::string at_rank = "@" + std::to_string(rank);
      archive.read(variant.name, params[variant.name + at_rank]);
      if (variant.spiked) archive.read(variant.name + "_scale", params[variant.name + "_scale" + at_rank]);
    }
  }
  return params;
}

std::map<std::string, torch::Tensor> run_ranks(int ranks, const TempDir& dir, const std::vector<std::string>& variants,
                                               std::string& failure) {
  std::vector<std::string> argv = {FULGOR_RUN_PATH,       "--nproc-per-node", std::to_string(ranks), "--",
                                   FULGOR_SHARDED_WORKER, dir.str()};
  argv.insert(argv.end(), variants.begin(), variants.end());
  Child launcher(argv, {}, dir / "log");
  const auto status = launcher.wait(std::chrono::seconds(300));
  if (!exited_with(status, 0)) {
    failure = launcher.log();
    return {};
  }
  return read_ranks(ranks, dir, variants);
}

// A job of 2 nodes of 2 ranks on loopback; its ranks' logs where one failed.
std::map<std::string, torch::Tensor> run_nodes(const TempDir& dir, const std::vector<std::string>& variants,
                                               std::string& failure) {
  std::vector<std::string> argv = {FULGOR_SHARDED_WORKER, dir.str()};
  argv.insert(argv.end(), variants.begin(), variants.end());
  auto ranks = start_nodes(argv, dir.str(), 2, 2);
  for (auto& rank : ranks)
    if (!exited_with(rank->wait(std::chrono::seconds(300)), 0)) failure += rank->log();
  if (!failure.empty()) return {};
  return read_ranks(4, dir, variants);
}

::testing::AssertionResult close(const torch::Tensor& actual, const torch::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  const double difference = (actual - expected).abs().max().item<double>();
  if (difference <= kRelative * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "largest difference " << difference << " of values up to " << scale;
}

// One 2-rank job and one 4-rank job, whose results the tests below check.
class ShardedTrainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    two_ = std::make_unique<TempDir>();
    four_ = std::make_unique<TempDir>();
    nodes_ = std::make_unique<TempDir>();
    params_ = run_ranks(2, *two_, two_rank_variants(), failure_);
    if (!failure_.empty()) return;
    const std::string mid = *two_ / "mid_shard_grad_op_adam_resumed.ckpt";
    const std::string full_mid = *two_ / "mid_full_shard_adam_resumed.ckpt";
    const std::string folder_mid = *two_ / "mid_full_shard_dcp_adam_resumed.ckpt";
    auto four =
        run_ranks(4, *four_,
                  {"ddp_adam", "shard_grad_op_adam", "zero1_sgd", "full_shard_adam", "shard_grad_op_adam_from=" + mid,
                   "full_shard_adam_from=" + full_mid, "full_shard_dcp_adam_from=" + folder_mid, "full_shard_wide_sgd"},
                  failure_);
    for (auto& [name, value] : four) params_["4:" + name] = value;
    for (auto& [name, value] : run_nodes(*nodes_, hybrid_variants(), failure_)) params_["2x2:" + name] = value;
  }
  static void TearDownTestSuite() {
    two_.reset();
    four_.reset();
    nodes_.reset();
  }
  void SetUp() override { ASSERT_TRUE(failure_.empty()) << failure_; }

  static torch::Tensor at(const std::string& name) { return params_.at(name); }

  static inline std::unique_ptr<TempDir> two_, four_, nodes_;
  static inline std::map<std::string, torch::Tensor> params_;
  static inline std::string failure_;
};

TEST_F(ShardedTrainer, EveryRankEndsWithTheSameParameters) {
  for (const std::string& variant : two_rank_variants()) {
    const std::string name = parse_variant(variant).name;
    EXPECT_TRUE(torch::equal(at(name + "@0"), at(name + "@1"))) << name;
  }
  for (const char* name : {"ddp_adam", "shard_grad_op_adam", "zero1_sgd", "full_shard_adam", "shard_grad_op_adam_from",
                           "full_shard_adam_from", "full_shard_dcp_adam_from"})
    for (const char* rank : {"@1", "@2", "@3"})
      EXPECT_TRUE(torch::equal(at(std::string("4:") + name + "@0"), at(std::string("4:") + name + rank))) << name;
  for (const std::string& variant : hybrid_variants())
    for (const char* rank : {"@1", "@2", "@3"})
      EXPECT_TRUE(torch::equal(at("2x2:" + variant + "@0"), at("2x2:" + variant + rank))) << variant;
}

// HYBRID_SHARD (Note [Replicated shards]) on 2 nodes of 2 ranks: the mean of
// the nodes' means is the 4 ranks' mean, so the fit is ddp's on 4 ranks; its
// resumes, from a checkpoint file and from a folder, end bit-equal.
TEST_F(ShardedTrainer, HybridShardOnTwoNodesEndsWithDdpsParameters) {
  EXPECT_TRUE(close(at("2x2:hybrid_shard_adam@0"), at("4:ddp_adam@0")));
  // The four ranks' batches together are the two ranks' (make_loader).
  EXPECT_TRUE(close(at("2x2:hybrid_shard_sgd@0"), at("ddp_sgd@0")));
  EXPECT_TRUE(torch::equal(at("2x2:hybrid_shard_adam_resumed@0"), at("2x2:hybrid_shard_adam@0")));
  EXPECT_TRUE(torch::equal(at("2x2:hybrid_shard_dcp_sgd_resumed@0"), at("2x2:hybrid_shard_sgd@0")));
}

// Under "16-mixed" a sharded strategy's ranks skip a step together where a
// gradient is infinite in one rank's piece alone, and back off alike: ZeRO-1
// ends as ddp, which skipped it too, backed off once; SHARD_GRAD_OP reduces
// in float16 too (Note [Sharded mixed precision]), which overflows more, but
// on every rank alike. (FULL_SHARD would compute in float16, which
// LibTorch 1.13 has no CPU kernels for; its scaler is set as theirs.)
TEST_F(ShardedTrainer, LossScalerSkipsAStepOnEveryRankAlike) {
  const double init = fulgor::GradScalerOptions{}.init_scale;
  EXPECT_EQ(at("ddp_spike_sgd_scale@0").item<double>(), init / 2);
  EXPECT_EQ(at("zero1_spike_sgd_scale@0").item<double>(), init / 2);
  EXPECT_TRUE(close(at("zero1_spike_sgd@0"), at("ddp_spike_sgd@0")));
  for (const char* strategy : {"zero1", "shard_grad_op"}) {
    const std::string scale = std::string(strategy) + "_spike_sgd_scale";
    EXPECT_LT(at(scale + "@0").item<double>(), init) << strategy;
    EXPECT_EQ(at(scale + "@0").item<double>(), at(scale + "@1").item<double>()) << strategy;
  }
}

// Note [Sharded mixed precision]: under bf16-mixed a FULL_SHARD unit
// computes with its parameters gathered in bfloat16 and its inputs cast to
// it (the worker checks), which are the values autocast casts the whole
// parameters of SHARD_GRAD_OP to: both fits are the same, bit for bit. Both
// reduce the gradients in bfloat16, where ddp reduces them in float32: each
// reduced gradient is rounded to bfloat16's 8 bits (a relative 2^-9), which
// after 6 Adam steps of 0.05 moved the parameters by 1.7e-3 (LibTorch
// 1.13) and 1.9e-3 (2.6) of their largest.
TEST_F(ShardedTrainer, MixedPrecisionGathersAndReducesInBFloat16) {
  EXPECT_TRUE(torch::equal(at("full_shard_bf16_adam@0"), at("shard_grad_op_bf16_adam@0")));
  const torch::Tensor ddp = at("ddp_bf16_adam@0"), sharded = at("full_shard_bf16_adam@0");
  EXPECT_FALSE(torch::equal(sharded, ddp)) << "reduced in float32, as ddp";
  EXPECT_LE((sharded - ddp).abs().max().item<double>(), 5e-3 * ddp.abs().max().item<double>());
  EXPECT_TRUE(torch::equal(at("full_shard_bf16_adam_resumed@0"), at("full_shard_bf16_adam@0")));
}

// Units that keep their parameters from forward to backward compute with
// the same values: the fit is FULL_SHARD's, bit for bit (the worker checks
// that they were kept, and released between steps).
TEST_F(ShardedTrainer, ReshardAfterForwardFalseChangesNoValue) {
  EXPECT_TRUE(torch::equal(at("full_shard_keep_adam@0"), at("full_shard_adam@0")));
}

TEST_F(ShardedTrainer, EndsWithDdpsParametersOnTwoRanks) {
  ShardedNet untrained(kShardedSeed, "adam");
  for (const char* optimizer : {"adam", "sgd"}) {
    const torch::Tensor ddp = at(std::string("ddp_") + optimizer + "@0");
    EXPECT_FALSE(close(ddp, flat_parameters(untrained))) << "training changed nothing";
    for (const char* strategy : {"zero1_", "shard_grad_op_", "full_shard_", "full_shard_ckpt_"})
      EXPECT_TRUE(close(at(strategy + std::string(optimizer) + "@0"), ddp)) << strategy << optimizer;
  }
  // NO_SHARD is ddp itself.
  EXPECT_TRUE(torch::equal(at("no_shard_adam@0"), at("ddp_adam@0")));
}

TEST_F(ShardedTrainer, EndsWithDdpsParametersOnFourRanks) {
  EXPECT_TRUE(close(at("4:shard_grad_op_adam@0"), at("4:ddp_adam@0")));
  EXPECT_TRUE(close(at("4:full_shard_adam@0"), at("4:ddp_adam@0")));
  // The four ranks' batches together are the two ranks' (make_loader).
  EXPECT_TRUE(close(at("4:shard_grad_op_adam@0"), at("ddp_adam@0")));
  EXPECT_TRUE(close(at("4:zero1_sgd@0"), at("ddp_sgd@0")));
}

// A parameter reduced and gathered in two messages, on 2 and 4 ranks.
TEST_F(ShardedTrainer, ParameterLargerThanAMessageEndsWithDdpsValues) {
  const torch::Tensor ddp = at("ddp_wide_sgd@0");
  EXPECT_FALSE(close(ddp.narrow(0, ddp.numel() - kWideElements, kWideElements), WideNet().wide->module()->w.detach()))
      << "training changed nothing";
  EXPECT_TRUE(close(at("full_shard_wide_sgd@0"), ddp));
  EXPECT_TRUE(close(at("4:full_shard_wide_sgd@0"), ddp));
  EXPECT_TRUE(torch::equal(at("full_shard_wide_sgd_resumed@1"), at("full_shard_wide_sgd@1")));
}

TEST_F(ShardedTrainer, ResumedFitEqualsTheUninterruptedOne) {
  for (const char* name : {"zero1_adam", "shard_grad_op_adam", "shard_grad_op_sgd", "full_shard_adam", "full_shard_sgd",
                           "full_shard_ckpt_adam"})
    for (const char* rank : {"@0", "@1"})
      EXPECT_TRUE(torch::equal(at(std::string(name) + "_resumed" + rank), at(name + std::string(rank)))) << name << rank;
}

// Note [Sharded training checkpoints]: a fit resumed from the folder its
// ranks wrote ends bit-equal to the uninterrupted fit, which saved nothing.
TEST_F(ShardedTrainer, ResumedFromShardedCheckpointsEqualsTheUninterruptedFit) {
  for (const char* strategy : {"ddp_", "zero1_", "shard_grad_op_", "full_shard_"})
    for (const char* optimizer : {"adam", "sgd"}) {
      const std::string resumed = std::string(strategy) + "dcp_" + optimizer + "_resumed";
      if (params_.count(resumed + "@0") == 0) continue;
      for (const char* rank : {"@0", "@1"})
        EXPECT_TRUE(torch::equal(at(resumed + rank), at(std::string(strategy) + optimizer + rank))) << resumed << rank;
    }
}

// Each rank wrote its own part: under FULL_SHARD, where the ranks hold
// different pieces of every parameter, both ranks' files hold tensors.
TEST_F(ShardedTrainer, ShardedCheckpointIsAFolderEveryRankWroteItsPartOf) {
  const std::filesystem::path folder = *two_ / "mid_full_shard_dcp_adam_resumed.ckpt";
  ASSERT_TRUE(fulgor::is_distributed_checkpoint(folder));
  for (const char* file : {"__0_0.distcp", "__1_0.distcp"})
    EXPECT_GT(std::filesystem::file_size(folder / file), 1000u) << file;
  const c10::IValue state = fulgor::read_distributed_checkpoint(folder);
  ShardedNet model(kShardedSeed, "adam");
  std::vector<std::string> saved, expected;
  for (const auto& item : state.toGenericDict().at("model").toGenericDict()) saved.push_back(item.key().toStringRef());
  for (const auto& item : fulgor::state_dict_of(model)) expected.push_back(item.key());
  std::sort(saved.begin(), saved.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(saved, expected);
  // The Adam state of the last layer's single-element bias, which rank 1
  // holds only padding of, is one element.
  const auto optimizer = state.toGenericDict().at("optimizer_0").toGenericDict();
  const auto bias_state = optimizer.at("state").toGenericDict().at("net.2.bias").toGenericDict();
  EXPECT_EQ(bias_state.at("exp_avg").toTensor().sizes(), torch::IntArrayRef({1}));
}

// PyTorch's dcp.load and dcp_to_torch_save (tests/interop/distributed_checkpoint.py
// check) read the FULL_SHARD folder's pieces as fulgor assembles them, the
// state a resume continues bit-equal.
TEST_F(ShardedTrainer, PyTorchReadsTheShardedCheckpoint) {
  const std::filesystem::path folder = *two_ / "mid_full_shard_dcp_adam_resumed.ckpt";
  const std::filesystem::path expected = *two_ / "full_shard_dcp_expected.pt";
  fulgor::torch_save(fulgor::read_distributed_checkpoint(folder), expected);
  Child python({FULGOR_DEBIAN_PYTHON3, std::string(FULGOR_INTEROP_SCRIPTS) + "/distributed_checkpoint.py", "check",
                folder.string(), expected.string()},
               {}, *two_ / "python_log");
  const auto status = python.wait(std::chrono::seconds(120));
  if (exited_with(status, 77)) GTEST_SKIP() << python.log();
  EXPECT_TRUE(exited_with(status, 0)) << python.log();
}

// A checkpoint file holds whole optimizer states (Note [Parameter shards]), a
// sharded one each rank's pieces as boxes of the whole: 4 ranks, and one
// process without a process group, continue the 2 ranks' fit from either.
TEST_F(ShardedTrainer, CheckpointOfTwoRanksContinuesOnFourAndInOneProcess) {
  EXPECT_TRUE(close(at("4:shard_grad_op_adam_from@0"), at("shard_grad_op_adam@0")));
  EXPECT_TRUE(close(at("4:full_shard_adam_from@0"), at("full_shard_adam@0")));
  EXPECT_TRUE(close(at("4:full_shard_dcp_adam_from@0"), at("full_shard_adam@0")));
  for (const std::string strategy : {"shard_grad_op", "full_shard", "full_shard_dcp"}) {
    ShardedNet model(kShardedSeed + 1, "adam");
    auto loader = make_loader(1, 0);
    auto options = sharded_options(parse_variant("ddp_adam"), *two_ / ("alone_" + strategy));
    options.strategy = "auto";
    fulgor::Trainer trainer(options);
    trainer.fit(model, loader, fulgor::FitOptions{*two_ / ("mid_" + strategy + "_adam_resumed.ckpt")});
    EXPECT_TRUE(close(flat_parameters(model), at(parse_variant(strategy + "_adam").strategy + "_adam@0"))) << strategy;
  }
}

fulgor::TrainerOptions one_process(const std::string& strategy) {
  fulgor::TrainerOptions o = quiet(ddp_options("", 1, 1));
  o.strategy = strategy;
  return o;
}

std::string fit_error(const fulgor::TrainerOptions& options) {
  ShardedNet model(kShardedSeed, "sgd");
  auto loader = make_loader(1, 0);
  try {
    fulgor::Trainer trainer(options);
    trainer.fit(model, loader);
  } catch (const fulgor::ConfigError& e) {
    return e.what();
  }
  return "";
}

// srun's cyclic distribution puts ranks 0 and 2 on node 0: no node holds
// consecutive ranks, which every rank says, none waiting on the others.
TEST(ShardedNodes, HybridShardRefusesNodesOfScatteredRanks) {
  TempDir dir;
  auto ranks = start_nodes({FULGOR_SHARDED_WORKER, dir.str(), "hybrid_shard_sgd"}, dir.str(), 2, 2, /*cyclic=*/true);
  for (auto& rank : ranks) {
    EXPECT_TRUE(exited_with(rank->wait(std::chrono::seconds(120)), 3)) << rank->log();
    EXPECT_NE(rank->log().find("sharding_strategy HYBRID_SHARD shards over each node's ranks, which must be "
                               "consecutive (node n holding ranks n * 2 to n * 2 + 1"),
              std::string::npos)
        << rank->log();
  }
}

// One rank of the second node holds a parameter more: every rank of both
// nodes stops at the set-up, naming itself by its rank in the job.
TEST(ShardedNodes, HybridShardStopsEveryRankWhenOneModuleDiffers) {
  TempDir dir;
  auto ranks = start_nodes({FULGOR_SHARDED_WORKER, dir.str(), "hybrid_shard_uneven_sgd"}, dir.str(), 2, 2);
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    EXPECT_TRUE(exited_with(ranks[rank]->wait(std::chrono::seconds(120)), 3)) << ranks[rank]->log();
    const std::string held = rank == 3 ? "5 trainable parameters of 32" : "4 trainable parameters of 31";
    EXPECT_NE(ranks[rank]->log().find("the ranks' modules differ: rank " + std::to_string(rank) + " has " + held +
                                      " elements in 2 sharded units, and the ranks range from 4 to 5 parameters"),
              std::string::npos)
        << ranks[rank]->log();
  }
}

TEST(ShardedOptions, SayWhatIsRefusedAndWhatIsAccepted) {
  auto o = one_process("fsdp");
  EXPECT_EQ(fit_error(o), "");  // FULL_SHARD, Lightning's default
  o.sharding_strategy = "hybrid_shard";  // one node: FULL_SHARD
  EXPECT_EQ(fit_error(o), "");
  o.sharding_strategy = "zero3";
  EXPECT_NE(fit_error(o).find("unknown sharding_strategy 'ZERO3'; known: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD"),
            std::string::npos)
      << fit_error(o);
  o.sharding_strategy = "shard_grad_op";  // any case, as Lightning reads it
  EXPECT_EQ(fit_error(o), "");
  auto z = one_process("single_device");
  z.zero_redundancy_optimizer = true;
  EXPECT_NE(fit_error(z).find("under strategy \"ddp\", not \"single_device\""), std::string::npos) << fit_error(z);
  z.strategy = "fsdp";
  z.sharding_strategy = "NO_SHARD";
  EXPECT_NE(fit_error(z).find("(fsdp shards it already)"), std::string::npos) << fit_error(z);
}

}  // namespace
