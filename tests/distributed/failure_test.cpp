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
  EXPECT_NE(log.find("the other rank (1)"), std::string::npos) << log;
}

TEST(PeerFailure, StoppedRankMakesTheOtherTimeOut) {
  fulgor::test::TempDir dir;
  auto [status, log] = survivor_of("stop", dir);
  ASSERT_TRUE(status.has_value()) << "rank 0 hung: " << log;
  EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << "a fulgor::Error: " << log;
  EXPECT_NE(log.find("gradient all_reduce failed on rank 0 of 2"), std::string::npos) << log;
  EXPECT_NE(log.find("did not answer within the timeout of 3000 ms"), std::string::npos) << log;
}

}  // namespace
