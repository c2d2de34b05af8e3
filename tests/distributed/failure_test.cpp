// A rank that dies or stops answering makes the others fail with a
// DistributedError instead of hanging. The ranks are started directly (not
// through fulgor-run, which would stop the survivors itself).

#include <gtest/gtest.h>

#include <filesystem>

#include "support/spawn.h"

namespace {

using fulgor::test::Child;

// Starts two ranks of the "die" scenario; returns rank 0's status and log.
std::pair<std::optional<int>, std::string> survivor_of(const std::string& mode, const fulgor::test::TempDir& dir) {
  auto ranks = fulgor::test::start_two_ranks({FULGOR_DISTRIBUTED_WORKER, "die", dir.str(), mode, "3000"}, dir.str());
  // The collective timeout is 3 s; the bound only keeps a hang from stalling the suite.
  const auto status = ranks[0]->wait(std::chrono::seconds(90));
  EXPECT_TRUE(std::filesystem::exists(dir / "victim_ready")) << ranks[1]->log();
  return {status, ranks[0]->log()};  // rank 1 is killed and reaped with its Child
}

TEST(PeerFailure, KilledRankMakesTheOtherFail) {
  fulgor::test::TempDir dir;
  auto [status, log] = survivor_of("kill", dir);
  ASSERT_TRUE(status.has_value()) << "rank 0 hung: " << log;
  EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << "a fulgor::Error: " << log;
  EXPECT_NE(log.find("gradient all_reduce failed on rank 0 of 2"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1 is gone: its connection closed"), std::string::npos) << log;
}

TEST(PeerFailure, StoppedRankMakesTheOtherTimeOut) {
  fulgor::test::TempDir dir;
  auto [status, log] = survivor_of("stop", dir);
  ASSERT_TRUE(status.has_value()) << "rank 0 hung: " << log;
  EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << "a fulgor::Error: " << log;
  EXPECT_NE(log.find("gradient all_reduce failed on rank 0 of 2"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1 did not arrive within the timeout of 3000 ms, which ProcessGroupOptions::timeout sets"),
            std::string::npos)
      << log;
}

// Note [Naming the ranks that did not arrive]: of four ranks the last stops;
// each of the others names it, and the two that failed beside it.
TEST(PeerFailure, EverySurvivorNamesTheStoppedRankAmongFour) {
  fulgor::test::TempDir dir;
  auto ranks = fulgor::test::start_ranks({FULGOR_DISTRIBUTED_WORKER, "die", dir.str(), "stop", "3000"}, dir.str(), 4);
  const char* others[] = {"ranks 1 and 2", "ranks 0 and 2", "ranks 0 and 1"};
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto status = ranks[rank]->wait(std::chrono::seconds(90));
    const std::string log = ranks[rank]->log();
    ASSERT_TRUE(status.has_value()) << "hung: " << log;
    EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << log;
    EXPECT_NE(log.find("gradient all_reduce failed on rank " + std::to_string(rank) + " of 4"), std::string::npos)
        << log;
    EXPECT_NE(log.find("rank 3 did not arrive within the timeout of 3000 ms"), std::string::npos) << log;
    EXPECT_NE(log.find(std::string(others[rank]) + " waited here too"), std::string::npos) << log;
  }
}

// When the rank that stops is rank 0, which hosts the job's store, the
// other cannot ask the store who is missing: it says so, within a bound.
TEST(PeerFailure, AStoppedRankZeroIsNotWaitedOnForever) {
  fulgor::test::TempDir dir;
  auto ranks =
      fulgor::test::start_two_ranks({FULGOR_DISTRIBUTED_WORKER, "die", dir.str(), "stop", "3000", "0"}, dir.str());
  const auto status = ranks[1]->wait(std::chrono::seconds(90));
  const std::string log = ranks[1]->log();
  ASSERT_TRUE(status.has_value()) << "rank 1 hung: " << log;
  EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << log;
  EXPECT_NE(log.find("the other rank (0) did not answer within the timeout of 3000 ms"), std::string::npos) << log;
  EXPECT_NE(log.find("(which rank is not known: the job's store, hosted by rank 0, "), std::string::npos) << log;
  EXPECT_NE(log.find("rank 0 may be stopped or gone)"), std::string::npos) << log;
}

}  // namespace
