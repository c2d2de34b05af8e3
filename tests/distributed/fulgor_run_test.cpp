// The fulgor-run launcher.

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "support/spawn.h"

namespace {

using fulgor::test::Child;

TEST(FulgorRun, SetsTheLaunchVariables) {
  fulgor::test::TempDir dir;
  const int port = fulgor::test::free_port();
  Child run({FULGOR_RUN_PATH, "--nproc-per-node", "3", "--master-port", std::to_string(port), "--",
             FULGOR_DISTRIBUTED_WORKER, "env", dir.str()},
            {}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(run.wait(std::chrono::seconds(60)), 0)) << run.log();
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream line(fulgor::test::read_text(dir / ("env_rank" + std::to_string(rank) + ".txt")));
    int r = -1, local = -1, world = -1, local_world = -1, node = -1, master_port = -1;
    std::string master_addr, source;
    line >> r >> local >> world >> local_world >> node >> master_addr >> master_port >> source;
    EXPECT_EQ(r, rank);
    EXPECT_EQ(local, rank);
    EXPECT_EQ(world, 3);
    EXPECT_EQ(local_world, 3);
    EXPECT_EQ(node, 0);
    EXPECT_EQ(master_addr, "127.0.0.1");
    EXPECT_EQ(master_port, port);
    EXPECT_EQ(source, "torchrun");
  }
}

TEST(FulgorRun, NumbersRanksByNode) {
  fulgor::test::TempDir dir;
  Child run({FULGOR_RUN_PATH, "--nproc-per-node=2", "--nnodes=3", "--node-rank=2", "--master-addr=head",
             "--master-port=4000", "--", FULGOR_DISTRIBUTED_WORKER, "env", dir.str()},
            {}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(run.wait(std::chrono::seconds(60)), 0)) << run.log();
  EXPECT_EQ(fulgor::test::read_text(dir / "env_rank5.txt"), "5 1 6 2 2 head 4000 torchrun\n");
  EXPECT_EQ(fulgor::test::read_text(dir / "env_rank4.txt"), "4 0 6 2 2 head 4000 torchrun\n");
}

TEST(FulgorRun, ReportsAFailingRankAndStopsTheOthers) {
  fulgor::test::TempDir dir;
  Child run({FULGOR_RUN_PATH, "--nproc-per-node", "3", "--", FULGOR_DISTRIBUTED_WORKER, "fail", dir.str(), "1", "7"},
            {}, dir / "log");
  const auto status = run.wait(std::chrono::seconds(50));
  const std::string log = run.log();
  ASSERT_TRUE(fulgor::test::exited_with(status, 7)) << "the failing rank's status: " << log;
  EXPECT_NE(log.find("rank 1 "), std::string::npos) << log;
  EXPECT_NE(log.find("exited with status 7"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(dir / "finished_rank0")) << "rank 0 was stopped, not left to finish";
  EXPECT_FALSE(std::filesystem::exists(dir / "finished_rank2"));
}

// fulgor-run's ranks, once it has started both (it handles signals from
// before the first); empty when it has not within a minute, a bound for a
// loaded machine.
std::vector<pid_t> both_ranks(const Child& run) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    std::ifstream children("/proc/" + std::to_string(run.pid()) + "/task/" + std::to_string(run.pid()) + "/children");
    std::vector<pid_t> pids;
    for (pid_t pid; children >> pid;) pids.push_back(pid);
    if (pids.size() == 2) return pids;
    if (std::chrono::steady_clock::now() > deadline) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST(FulgorRun, ReportsARankKilledBySignal) {
  fulgor::test::TempDir dir;
  Child run({FULGOR_RUN_PATH, "--nproc-per-node", "2", "--", FULGOR_DISTRIBUTED_WORKER, "sleep", dir.str()}, {},
            dir / "log");
  // Kill the second rank (the youngest child).
  const std::vector<pid_t> ranks = both_ranks(run);
  ASSERT_EQ(ranks.size(), 2u) << "fulgor-run did not start 2 ranks";
  kill(ranks[1], SIGKILL);
  const auto status = run.wait(std::chrono::seconds(50));
  const std::string log = run.log();
  ASSERT_TRUE(fulgor::test::exited_with(status, 128 + SIGKILL)) << log;
  EXPECT_NE(log.find("killed by signal 9"), std::string::npos) << log;
}

TEST(FulgorRun, ForwardsSigterm) {
  fulgor::test::TempDir dir;
  Child run({FULGOR_RUN_PATH, "--nproc-per-node", "2", "--", FULGOR_DISTRIBUTED_WORKER, "sleep", dir.str()}, {},
            dir / "log");
  // Not before it has started the ranks: a SIGTERM before fulgor-run handles
  // it would end it as the signal's default does.
  ASSERT_EQ(both_ranks(run).size(), 2u) << "fulgor-run did not start 2 ranks";
  run.signal(SIGTERM);
  const auto status = run.wait(std::chrono::seconds(50));
  ASSERT_TRUE(fulgor::test::exited_with(status, 128 + SIGTERM)) << run.log();
}

TEST(FulgorRun, RejectsBadCommandLines) {
  fulgor::test::TempDir dir;
  for (std::vector<std::string> args : {std::vector<std::string>{"--", "/bin/true"},
                                        {"--nproc-per-node", "0", "--", "/bin/true"},
                                        {"--nproc-per-node", "2"},
                                        {"--nproc-per-node", "2", "--nnodes", "2", "--", "/bin/true"},
                                        {"--nproc-per-node", "2", "--bogus", "1", "--", "/bin/true"}}) {
    args.insert(args.begin(), FULGOR_RUN_PATH);
    Child run(args, {}, dir / "log");
    EXPECT_TRUE(fulgor::test::exited_with(run.wait(std::chrono::seconds(20)), 2)) << run.log();
  }
}

}  // namespace
