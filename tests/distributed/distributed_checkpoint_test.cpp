// Distributed checkpoints across ranks: saved by every rank of a Gloo group,
// loaded by another number of ranks, by one process without a group, and by
// PyTorch's torch.distributed.checkpoint.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fulgor/interop/torch_save.h>

#include "support/dcp_scenario.h"
#include "support/scenarios.h"
#include "support/spawn.h"

namespace {

using fulgor::test::TempDir;

void run_ranks(const std::string& scenario, const TempDir& dir, const std::string& folder, int n) {
  auto ranks = fulgor::test::start_ranks({FULGOR_DISTRIBUTED_WORKER, scenario, dir.str(), folder}, dir.str(), n);
  for (int rank = 0; rank < n; ++rank) {
    const auto status = ranks[rank]->wait(std::chrono::seconds(120));
    ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << scenario << " rank " << rank << ": " << ranks[rank]->log();
  }
}

// Each of `n` ranks loaded exactly its rows.
void expect_loaded(const TempDir& dir, int n) {
  fulgor::test::DcpCase k = fulgor::test::make_dcp_case();
  for (int rank = 0; rank < n; ++rank) {
    SCOPED_TRACE("loaded by rank " + std::to_string(rank) + " of " + std::to_string(n));
    auto loaded = fulgor::test::load_tensors(dir / ("dcp_loaded_rank" + std::to_string(rank) + ".pt"),
                                             {"a", "b", "replicated", "epoch"});
    auto [a_begin, a_rows] = fulgor::test::rows_of(7, rank, n);
    auto [b_begin, b_rows] = fulgor::test::rows_of(5, rank, n);
    EXPECT_TRUE(torch::equal(loaded["a"], k.a.narrow(0, a_begin, a_rows)));
    EXPECT_TRUE(torch::equal(loaded["b"], k.b.narrow(0, b_begin, b_rows)));
    EXPECT_TRUE(torch::equal(loaded["replicated"], k.replicated));
    EXPECT_EQ(loaded["epoch"].item<int64_t>(), 5);
  }
}

TEST(DistributedCheckpointRanks, SavedByTwoRanksLoadsAtFourAndInOneProcess) {
  TempDir dir;
  const std::string folder = dir / "ckpt";
  run_ranks("dcp_save", dir, folder, 2);
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt/__0_0.distcp"));
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt/__1_0.distcp")) << "each rank writes its own pieces";

  c10::IValue whole = fulgor::read_distributed_checkpoint(folder);
  fulgor::test::DcpCase k = fulgor::test::make_dcp_case();
  auto model = whole.toGenericDict().at("model").toGenericDict();
  auto meta = whole.toGenericDict().at("meta").toGenericDict();
  EXPECT_TRUE(torch::equal(model.at("a").toTensor(), k.a));
  EXPECT_TRUE(torch::equal(model.at("b").toTensor(), k.b));
  EXPECT_TRUE(torch::equal(model.at("replicated").toTensor(), k.replicated));
  EXPECT_EQ(meta.at("epoch").toInt(), 5);
  EXPECT_EQ(meta.at("rank1").toStringRef(), "saved by 1");

  run_ranks("dcp_load", dir, folder, 4);
  expect_loaded(dir, 4);
}

TEST(DistributedCheckpointRanks, SavedByFourRanksWithAnEmptyPieceLoadsAtTwo) {
  TempDir dir;
  const std::string folder = dir / "ckpt";
  run_ranks("dcp_save", dir, folder, 4);  // b's 5 rows: 2, 2, 1 and none on rank 3
  run_ranks("dcp_load", dir, folder, 2);
  expect_loaded(dir, 2);
  run_ranks("dcp_save", dir, folder, 2);  // replaces it whole: rank 2's and 3's files go with it
  EXPECT_FALSE(std::filesystem::exists(dir / "ckpt/__3_0.distcp"));
  EXPECT_EQ(fulgor::read_distributed_checkpoint(folder).toGenericDict().at("meta").toGenericDict().size(), 3u);
}

// A rank that cannot plan its part fails every rank with its message, at
// once, and nothing is written.
TEST(DistributedCheckpointRanks, ARankThatCannotPlanFailsEveryRank) {
  TempDir dir;
  auto ranks = fulgor::test::start_ranks({FULGOR_DISTRIBUTED_WORKER, "dcp_save_misplaced", dir.str(), dir / "ckpt"},
                                         dir.str(), 2);
  for (int rank = 0; rank < 2; ++rank) {
    const auto status = ranks[rank]->wait(std::chrono::seconds(60));
    EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << ranks[rank]->log();
    EXPECT_NE(ranks[rank]->log().find("cannot save the distributed checkpoint '" + dir / "ckpt" +
                                      "': rank 1: the placement of 'model.a' does not have its tensor's 2 dimensions"),
              std::string::npos)
        << ranks[rank]->log();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "ckpt"));
}

// What PyTorch's load finds in the folder 2 ranks saved
// (tests/interop/distributed_checkpoint.py check): every tensor bit-equal to
// the whole one, every object as given.
TEST(DistributedCheckpointRanks, PyTorchReadsWhatTwoRanksSaved) {
  TempDir dir;
  const std::string folder = dir / "ckpt";
  run_ranks("dcp_save", dir, folder, 2);
  fulgor::test::DcpCase k = fulgor::test::make_dcp_case();
  auto nested = [] { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); };
  auto model = nested(), meta = nested(), expected = nested();
  model.insert("a", k.a);
  model.insert("b", k.b);
  model.insert("replicated", k.replicated);
  meta.insert("epoch", int64_t{5});
  meta.insert("rank0", std::string("saved by 0"));
  meta.insert("rank1", std::string("saved by 1"));
  expected.insert("model", model);
  expected.insert("meta", meta);
  fulgor::torch_save(expected, dir / "expected.pt");
  fulgor::test::Child python({FULGOR_DEBIAN_PYTHON3, std::string(FULGOR_INTEROP_SCRIPTS) + "/distributed_checkpoint.py",
                              "check", folder, dir / "expected.pt"},
                             {}, dir / "python_log");
  const auto status = python.wait(std::chrono::seconds(120));
  if (fulgor::test::exited_with(status, 77)) GTEST_SKIP() << python.log();
  EXPECT_TRUE(fulgor::test::exited_with(status, 0)) << python.log();
}

}  // namespace
