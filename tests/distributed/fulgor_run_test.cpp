// The fulgor-run launcher.

#include <gtest/gtest.h>

#include <cerrno>
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

// Note [Restarts] (src/tools/fulgor_run.cpp). The ranks run a shell script,
// which starts at once. Each start of rank N appends "RESTART_COUNT
// MAX_RESTARTS PID" (torchrun's variables and its own pid) to starts_rankN in
// the test's folder. Rank 0 then runs `rank0`, which must not end before it is
// stopped; rank 1 waits for rank 0 of the same start, so that rank 0 is
// stopped and not merely seen to have ended, and then runs `rank1`. With
// `first_start_only`, later starts end at once with status 0.
std::string ranks_script(const std::string& rank0, const std::string& rank1, bool first_start_only) {
  return std::string(R"(
echo "$TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS $$" >> "$1/starts_rank$RANK"
touch "$1/started${TORCHELASTIC_RESTART_COUNT}_rank$RANK"
)") + (first_start_only ? "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] || exit 0\n" : "") +
         "if [ \"$RANK\" = 0 ]; then " + rank0 + "; fi\n" +
         "while [ ! -e \"$1/started${TORCHELASTIC_RESTART_COUNT}_rank0\" ]; do sleep 0.05; done\n" + rank1 + "\n";
}

// fulgor-run with `options` starting `script` as 2 ranks, with `dir` as its $1.
Child start_script(const fulgor::test::TempDir& dir, std::vector<std::string> options, const std::string& script) {
  std::vector<std::string> argv = {FULGOR_RUN_PATH, "--nproc-per-node", "2"};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"--", "/bin/sh", "-c", script, "sh", dir.str()});
  return Child(argv, {}, dir / "log");
}

// What one start of a rank wrote (ranks_script).
struct Start {
  long restart_count = -1;
  long max_restarts = -1;
  pid_t pid = 0;
};

std::vector<Start> starts_of(const fulgor::test::TempDir& dir, int rank) {
  std::istringstream lines(fulgor::test::read_text(dir / ("starts_rank" + std::to_string(rank))));
  std::vector<Start> starts;
  for (Start s; lines >> s.restart_count >> s.max_restarts >> s.pid;) starts.push_back(s);
  return starts;
}

// Bounds a whole run: the scripts end or are stopped within seconds.
constexpr std::chrono::seconds kScriptLimit{60};

TEST(FulgorRun, RestartsEveryRankAfterAFailure) {
  fulgor::test::TempDir dir;
  Child run = start_script(dir, {"--max-restarts", "1"}, ranks_script("exec sleep 30", "exit 7", true));
  const auto status = run.wait(kScriptLimit);
  const std::string log = run.log();
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  EXPECT_NE(log.find("restarting the 2 ranks of this node (restart 1 of --max-restarts 1)"), std::string::npos) << log;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<Start> starts = starts_of(dir, rank);
    ASSERT_EQ(starts.size(), 2u) << "rank " << rank << " runs again, as in torchrun, even if it did not fail";
    for (long restart = 0; restart < 2; ++restart) {
      EXPECT_EQ(starts[restart].restart_count, restart) << "TORCHELASTIC_RESTART_COUNT of rank " << rank;
      EXPECT_EQ(starts[restart].max_restarts, 1) << "TORCHELASTIC_MAX_RESTARTS of rank " << rank;
    }
  }
}

TEST(FulgorRun, WithoutRestartsEndsWithTheFailedRank) {
  fulgor::test::TempDir dir;
  Child run = start_script(dir, {"--max-restarts", "0"}, ranks_script("exec sleep 30", "exit 7", true));
  const auto status = run.wait(kScriptLimit);
  const std::string log = run.log();
  ASSERT_TRUE(fulgor::test::exited_with(status, 7)) << log;
  EXPECT_NE(log.find("giving up after 0 restarts (--max-restarts 0): rank 1 (local rank 1, pid "), std::string::npos)
      << log;
  EXPECT_NE(log.find("exited with status 7\n"), std::string::npos) << log;
  EXPECT_EQ(starts_of(dir, 0).size(), 1u);
  EXPECT_EQ(starts_of(dir, 1).size(), 1u);
}

TEST(FulgorRun, NamesTheSignalThatKilledTheLastStart) {
  fulgor::test::TempDir dir;
  Child run = start_script(dir, {"--max-restarts", "1"}, ranks_script("exec sleep 30", "kill -KILL $$", false));
  const auto status = run.wait(kScriptLimit);
  const std::string log = run.log();
  ASSERT_TRUE(fulgor::test::exited_with(status, 128 + SIGKILL)) << log;
  EXPECT_NE(log.find("giving up after 1 restart (--max-restarts 1): rank 1 (local rank 1, pid "), std::string::npos)
      << log;
  EXPECT_NE(log.find("was killed by signal 9 (Killed)\n"), std::string::npos) << log;
  EXPECT_EQ(starts_of(dir, 1).size(), 2u);
}

TEST(FulgorRun, KillsARankThatIgnoresSigtermBeforeRestarting) {
  fulgor::test::TempDir dir;
  const auto began = std::chrono::steady_clock::now();
  Child run = start_script(dir, {"--max-restarts", "1", "--grace-period", "1"},
                           ranks_script("trap '' TERM; exec sleep 30", "exit 3", false));
  const auto status = run.wait(kScriptLimit);
  const std::string log = run.log();
  ASSERT_TRUE(fulgor::test::exited_with(status, 3)) << log;
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(25))
      << "rank 0 was killed after the grace period, not left to sleep for 30 s";
  EXPECT_NE(log.find("1 rank still running after the 1 s grace period; killing"), std::string::npos) << log;
  const std::vector<Start> starts = starts_of(dir, 0);
  ASSERT_EQ(starts.size(), 2u) << log;
  for (const Start& start : starts)
    EXPECT_TRUE(kill(start.pid, 0) != 0 && errno == ESRCH) << "rank 0 of start " << start.restart_count << " is left";
}

TEST(FulgorRun, RefusesRestartsOnSeveralNodes) {
  fulgor::test::TempDir dir;
  Child run({FULGOR_RUN_PATH, "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0", "--master-port", "4000",
             "--max-restarts", "1", "--", "/bin/true"},
            {}, dir / "log");
  EXPECT_TRUE(fulgor::test::exited_with(run.wait(std::chrono::seconds(20)), 2));
  EXPECT_NE(run.log().find("--max-restarts 1 is not accepted with --nnodes 2: expected 0"), std::string::npos)
      << run.log();
}

TEST(FulgorRun, RejectsBadCommandLines) {
  fulgor::test::TempDir dir;
  for (std::vector<std::string> args : {std::vector<std::string>{"--", "/bin/true"},
                                        {"--nproc-per-node", "0", "--", "/bin/true"},
                                        {"--nproc-per-node", "2"},
                                        {"--nproc-per-node", "2", "--nnodes", "2", "--", "/bin/true"},
                                        {"--nproc-per-node", "2", "--bogus", "1", "--", "/bin/true"},
                                        {"--nproc-per-node", "2", "--max-restarts", "-1", "--", "/bin/true"},
                                        {"--nproc-per-node", "2", "--max-restarts", "many", "--", "/bin/true"}}) {
    args.insert(args.begin(), FULGOR_RUN_PATH);
    Child run(args, {}, dir / "log");
    EXPECT_TRUE(fulgor::test::exited_with(run.wait(std::chrono::seconds(20)), 2)) << run.log();
  }
}

}  // namespace
