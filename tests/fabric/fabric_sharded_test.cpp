// Fabric under the sharded strategies: two ranks of the CPU (gloo over
// loopback) train as under ddp, resume exactly from Fabric's checkpoints,
// and a step that bypasses Fabric is named.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "../distributed/support/spawn.h"

namespace {

using fulgor::test::TempDir;

torch::Tensor parameters_of(const TempDir& dir, int rank, const std::string& variant) {
  torch::serialize::InputArchive archive;
  archive.load_from(dir / ("sharded_rank" + std::to_string(rank) + ".pt"));
  torch::Tensor t;
  archive.read(variant, t);
  return t;
}

// The ddp loop, then the sharded ones, each resumed from its first epoch's
// checkpoint too, each with both passes of a step synchronized, and under
// "16-mixed" with a spike: one launch, as the variants' ranks share a
// process group.
TEST(FabricSharded, LoopsEndAsUnderDdpAndResumeExactly) {
  TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks(
      FULGOR_FABRIC_WORKER,
      {"sharded", dir.str(),
       "ddp,zero1,shard_grad_op,full_shard,zero1_resumed,shard_grad_op_resumed,full_shard_resumed,ddp_twice,"
       "zero1_twice,shard_grad_op_twice,full_shard_twice,zero1_dcp_resumed,shard_grad_op_dcp_resumed,"
       "full_shard_dcp_resumed,ddp_spike,zero1_spike",
       "run"},
      dir / "sharded.log", std::chrono::seconds(180));
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  for (int rank = 0; rank < 2; ++rank) {
    const torch::Tensor ddp = parameters_of(dir, rank, "ddp");
    const double scale = ddp.abs().max().item<double>();
    for (const std::string variant : {"zero1", "shard_grad_op", "full_shard"}) {
      const torch::Tensor sharded = parameters_of(dir, rank, variant);
      EXPECT_LE((sharded - ddp).abs().max().item<double>(), 1e-12 * scale) << variant << ", rank " << rank;
      // From a checkpoint file, and from a sharded checkpoint's folder.
      for (const std::string& resumed_variant : {variant + "_resumed", variant + "_dcp_resumed"}) {
        const torch::Tensor resumed = parameters_of(dir, rank, resumed_variant);
        EXPECT_TRUE(torch::equal(resumed, sharded)) << resumed_variant << ", rank " << rank << ": max difference "
                                                    << (resumed - sharded).abs().max().item<double>();
      }
      // Two synchronized passes before a step add up, as under ddp.
      const torch::Tensor twice = parameters_of(dir, rank, variant + "_twice");
      const torch::Tensor ddp_twice = parameters_of(dir, rank, "ddp_twice");
      EXPECT_LE((twice - ddp_twice).abs().max().item<double>(), 1e-12 * scale) << variant << "_twice, rank " << rank;
    }
    // Under "16-mixed" the ranks skip the step whose gradient is infinite in
    // one rank's piece alone together, as ddp's (the worker checks that the
    // scale backed off once).
    EXPECT_LE(
        (parameters_of(dir, rank, "zero1_spike") - parameters_of(dir, rank, "ddp_spike")).abs().max().item<double>(),
        1e-12 * scale)
        << "zero1_spike, rank " << rank;
  }
}

// HYBRID_SHARD on 2 nodes of one rank: each node's one rank holds whole
// pieces, its replica on the other node the same (Note [Replicated shards]),
// and their gradients are averaged as ddp's; it resumes exactly.
TEST(FabricSharded, HybridShardOnTwoNodesEndsAsUnderDdp) {
  TempDir dir;
  auto ranks = fulgor::test::start_nodes({FULGOR_FABRIC_WORKER, "sharded", dir.str(),
                                          "ddp,hybrid_shard,hybrid_shard_resumed,hybrid_shard_dcp_resumed", "run"},
                                         dir.str(), 2, 1);
  for (auto& rank : ranks)
    ASSERT_TRUE(fulgor::test::exited_with(rank->wait(std::chrono::seconds(180)), 0)) << rank->log();
  for (int rank = 0; rank < 2; ++rank) {
    const torch::Tensor ddp = parameters_of(dir, rank, "ddp"), hybrid = parameters_of(dir, rank, "hybrid_shard");
    EXPECT_LE((hybrid - ddp).abs().max().item<double>(), 1e-12 * ddp.abs().max().item<double>()) << rank;
    EXPECT_TRUE(torch::equal(parameters_of(dir, rank, "hybrid_shard_resumed"), hybrid)) << rank;
    EXPECT_TRUE(torch::equal(parameters_of(dir, rank, "hybrid_shard_dcp_resumed"), hybrid)) << rank;
  }
}

// optimizer->step() steps the pieces and gathers nothing: the next reduction
// would overwrite that step, so it stops the run.
TEST(FabricSharded, StepOfTheBareOptimizerIsNamed) {
  TempDir dir;
  auto [status, log] =
      fulgor::test::run_two_ranks(FULGOR_FABRIC_WORKER, {"sharded", dir.str(), "shard_grad_op", "bare_step"},
                                  dir / "log", std::chrono::seconds(180));
  EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << log;
  EXPECT_NE(log.find("without gathering them into its parameters: under strategy 'fsdp', step through the "
                     "FabricOptimizer (optimizer.step()) or fabric.step(optimizer), not optimizer->step()"),
            std::string::npos)
      << log;
}

// Set up before its module, the optimizer would step whole parameters whose
// gradients backward frees: refused.
TEST(FabricSharded, OptimizerSetUpBeforeItsModuleIsRefused) {
  TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks(
      FULGOR_FABRIC_WORKER, {"sharded", dir.str(), "zero1", "optimizer_first"}, dir / "log", std::chrono::seconds(180));
  EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << log;
  EXPECT_NE(log.find("under zero_redundancy_optimizer an optimizer steps the ranks' pieces of the set-up modules' "
                     "parameters, and this one holds 4 trainable parameters of no set-up module: set the module up "
                     "first"),
            std::string::npos)
      << log;
}

}  // namespace
