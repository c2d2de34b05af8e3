// The Trainer's own launcher (Note [The Trainer's own launcher]): a program
// run once, without a launcher, on an accelerator with two devices, trains on
// both; its faults end the job within seconds with the rank named.

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "fulgor/fulgor.h"
#include "fulgor/distributed/strategy.h"
#include "support/spawn.h"

namespace {

using fulgor::test::Child;
using fulgor::test::TempDir;

// Starts the worker once, as a user starts a program, with `env` added to its environment.
std::unique_ptr<Child> start_program(const std::string& mode, const TempDir& dir,
                                     const std::map<std::string, std::string>& env = {}) {
  return std::make_unique<Child>(std::vector<std::string>{FULGOR_SELF_LAUNCH_WORKER, mode, dir.str()}, env,
                                 dir / "log");
}

// The value after `key` in a file of "key value" lines, or "".
std::string field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string k, v;
  while (in >> k >> v)
    if (k == key) return v;
  return "";
}

bool process_exists(const std::string& pid) {
  return !pid.empty() && std::filesystem::exists("/proc/" + pid) &&
         fulgor::test::read_text("/proc/" + pid + "/stat").find(") Z ") == std::string::npos;
}

// A rank's process is gone (or a zombie) within `limit`.
bool ends_within(const std::string& pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (process_exists(pid) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return !process_exists(pid);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(SelfLaunch, TrainsOnEveryDeviceAtDefaults) {
  TempDir dir;
  auto program = start_program("fit", dir);
  const auto status = program->wait(std::chrono::seconds(120));
  const std::string log = program->log();
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  EXPECT_EQ(count(log, "summary "), 1u) << "rank 0 alone prints: " << log;
  EXPECT_NE(log.find("summary 32"), std::string::npos) << "256 samples, 8 a batch, half to each rank: " << log;
  // Rank 1 is the program run again by rank 0.
  EXPECT_EQ(field(dir / "rank1.txt", "parent"), field(dir / "rank0.txt", "pid"));
  EXPECT_EQ(field(dir / "rank0.txt", "world_size"), "2");
  EXPECT_EQ(field(dir / "rank1.txt", "world_size"), "2");
  // Each rank's accelerator is told which of the two devices it drives.
  EXPECT_EQ(fulgor::test::read_text(dir / "setup_rank0.txt").substr(0, 64).find("index 0 local_rank 0"), 0u);
  EXPECT_EQ(fulgor::test::read_text(dir / "setup_rank1.txt").substr(0, 64).find("index 1 local_rank 1"), 0u);
  EXPECT_NE(fulgor::test::read_text(dir / "setup_rank1.txt").find("world_size 2"), std::string::npos);
}

TEST(SelfLaunch, UnderALauncherStartsNothing) {
  TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks(FULGOR_SELF_LAUNCH_WORKER, {"fit", dir.str()}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  EXPECT_EQ(count(log, "summary "), 1u) << log;
  // Both ranks are fulgor-run's children: neither started a rank of its own.
  EXPECT_EQ(field(dir / "rank0.txt", "parent"), field(dir / "rank1.txt", "parent"));
  EXPECT_EQ(field(dir / "rank0.txt", "world_size"), "2");
}

// Returns the log of a program whose rank 1 fails in `mode`, after checking
// that the job ended within seconds with a non-zero status and left no rank.
std::string failed_job(const std::string& mode, const TempDir& dir,
                       const std::map<std::string, std::string>& env = {}) {
  auto program = start_program(mode, dir, env);
  const auto started = std::chrono::steady_clock::now();
  const auto status = program->wait(std::chrono::seconds(90));
  const std::string log = program->log();
  EXPECT_TRUE(status.has_value()) << "the job hung: " << log;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(60)) << log;
  EXPECT_TRUE(status && !fulgor::test::exited_with(status, 0)) << log;
  const std::string rank1 = fulgor::test::read_text(dir / "setup_rank1.txt");
  const std::string pid = rank1.substr(rank1.rfind("pid ") + 4, rank1.find('\n') - rank1.rfind("pid ") - 4);
  EXPECT_TRUE(ends_within(pid, std::chrono::seconds(5))) << "rank 1 (pid " << pid << ") outlived the job";
  return log;
}

TEST(SelfLaunch, AKilledRankEndsTheJobNamingIt) {
  TempDir dir;
  const std::string log = failed_job("kill", dir);
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(rank 1 \(pid \d+\) was killed by signal 9 \(Killed\))"))) << log;
  EXPECT_NE(log.find("the cause: rank 1"), std::string::npos) << "rank 0's Trainer error names it: " << log;
}

TEST(SelfLaunch, ARankThatThrowsEndsTheJobNamingIt) {
  TempDir dir;
  const std::string log = failed_job("throw", dir);
  EXPECT_NE(log.find("rank 1 fails on purpose"), std::string::npos) << "rank 1's own message: " << log;
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(rank 1 \(pid \d+\) exited with status 4)"))) << log;
}

TEST(SelfLaunch, SigtermToTheProgramStopsEveryRankWithACheckpoint) {
  TempDir dir;
  auto program = start_program("sigterm", dir);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(dir / "training") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(std::filesystem::exists(dir / "training")) << program->log();
  program->signal(SIGTERM);
  const auto status = program->wait(std::chrono::seconds(30));
  const std::string log = program->log();
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  EXPECT_EQ(field(dir / "rank0.txt", "message"), "stopped");
  EXPECT_EQ(field(dir / "rank1.txt", "message"), "stopped");
  EXPECT_NE(fulgor::test::read_text(dir / "rank1.txt").find("stopped by signal 15 (SIGTERM)"), std::string::npos);
  const std::string checkpoint = field(dir / "rank0.txt", "checkpoint");
  EXPECT_EQ(checkpoint.substr(checkpoint.size() - 9), "last.ckpt") << log;
  EXPECT_TRUE(std::filesystem::exists(checkpoint)) << checkpoint;
}

// Note [Restarting the Trainer's own ranks]: rank 1 is killed in the second
// epoch of the first start; the program started again as both ranks resumes
// from "last", the first epoch's checkpoint, which the first start (finding
// none) saved.
TEST(SelfLaunch, WithMaxRestartsAFailureRestartsEveryRankFromTheLastCheckpoint) {
  TempDir dir;
  auto program = start_program("restart", dir, {{"FULGOR_MAX_RESTARTS", "2"}});
  const auto status = program->wait(std::chrono::seconds(180));
  const std::string log = program->log();
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(rank 1 \(pid \d+\) was killed by signal 9 \(Killed\))"))) << log;
  EXPECT_EQ(count(log, "fulgor: restarting the 2 ranks (restart 1 of FULGOR_MAX_RESTARTS=2)"), 1u) << log;
  EXPECT_EQ(count(log, "restarting"), 1u) << log;
  EXPECT_EQ(count(log, ".fit(ckpt_path=\"last\") is set, but there is no last checkpoint available"), 1u) << log;
  EXPECT_EQ(count(log, "summary "), 1u) << log;
  EXPECT_NE(log.find("summary 32"), std::string::npos) << log;
  // Both ranks are the supervising program's children, and resumed.
  EXPECT_EQ(field(dir / "rank0.txt", "parent"), std::to_string(program->pid()));
  EXPECT_EQ(field(dir / "rank1.txt", "parent"), std::to_string(program->pid()));
  for (const char* rank : {"rank0.txt", "rank1.txt"}) {
    EXPECT_EQ(field(dir / rank, "restart_count"), "1") << rank;
    EXPECT_EQ(field(dir / rank, "steps"), "16") << rank << ": the second epoch only";
  }
}

TEST(SelfLaunch, WithMaxRestartsAJobThatKeepsFailingGivesUpWithTheRanksStatus) {
  TempDir dir;
  auto program = start_program("kill", dir, {{"FULGOR_MAX_RESTARTS", "1"}});
  const auto status = program->wait(std::chrono::seconds(120));
  const std::string log = program->log();
  EXPECT_TRUE(fulgor::test::exited_with(status, 128 + SIGKILL)) << log;
  EXPECT_EQ(count(log, "fulgor: restarting the 2 ranks (restart 1 of FULGOR_MAX_RESTARTS=1)"), 1u) << log;
  EXPECT_TRUE(std::regex_search(
      log, std::regex(R"(fulgor: giving up after 1 restart \(FULGOR_MAX_RESTARTS=1\): rank 1 \(pid \d+\) was )"
                      R"(killed by signal 9 \(Killed\))")))
      << log;
}

TEST(SelfLaunch, WithMaxRestartsSigtermToTheProgramStopsEveryRankWithoutARestart) {
  TempDir dir;
  auto program = start_program("sigterm", dir, {{"FULGOR_MAX_RESTARTS", "1"}});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(dir / "training") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(std::filesystem::exists(dir / "training")) << program->log();
  program->signal(SIGTERM);
  const auto status = program->wait(std::chrono::seconds(30));
  const std::string log = program->log();
  EXPECT_TRUE(fulgor::test::exited_with(status, 128 + SIGTERM)) << log;
  EXPECT_EQ(count(log, "restarting"), 0u) << log;
  EXPECT_EQ(field(dir / "rank0.txt", "message"), "stopped");
  EXPECT_EQ(field(dir / "rank1.txt", "message"), "stopped");
  const std::string checkpoint = field(dir / "rank0.txt", "checkpoint");
  EXPECT_TRUE(std::filesystem::exists(checkpoint)) << checkpoint << "\n" << log;
}

TEST(SelfLaunch, AMaxRestartsThatIsNotACountIsRefusedNamingIt) {
  for (const std::string value : {"two", "-1", "1.5"}) {
    TempDir dir;
    auto program = start_program("fit", dir, {{"FULGOR_MAX_RESTARTS", value}});
    const auto status = program->wait(std::chrono::seconds(60));
    const std::string log = program->log();
    EXPECT_TRUE(fulgor::test::exited_with(status, 3)) << log;
    EXPECT_NE(log.find("FULGOR_MAX_RESTARTS='" + value + "' is not accepted: expected how many times to restart"),
              std::string::npos)
        << log;
    EXPECT_FALSE(std::filesystem::exists(dir / "setup_rank1.txt")) << "a rank was started";
  }
}

TEST(SelfLaunch, SingleDeviceStrategyRefusesTwoDevices) {
  auto cpu = fulgor::make_accelerator("cpu");
  try {
    fulgor::detail::launches_ranks("single_device", {}, *cpu, fulgor::Devices(2), 2);
    FAIL() << "expected a ConfigError";
  } catch (const fulgor::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("strategy 'single_device' runs on one device"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("strategy 'auto' or 'ddp'"), std::string::npos);
  }
  EXPECT_TRUE(fulgor::detail::launches_ranks("auto", {}, *cpu, fulgor::Devices(2), 2));
  EXPECT_TRUE(fulgor::detail::launches_ranks("ddp", {}, *cpu, fulgor::Devices(2), 2));
  EXPECT_FALSE(fulgor::detail::launches_ranks("ddp", {}, *cpu, fulgor::Devices(1), 1));
  fulgor::DistributedEnvironment launched;
  launched.world_size = 2;
  EXPECT_FALSE(fulgor::detail::launches_ranks("auto", launched, *cpu, fulgor::Devices(2), 2));
}

// A CPU-backed accelerator with four devices, as a simulator has.
class FourSimulated final : public fulgor::Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "four simulated devices"; }
  fulgor::Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 4; }
  std::string distributed_backend() const override { return "gloo"; }
};

TEST(SelfLaunch, DeviceSetupGivesCpuBackedDevicesTheirIndex) {
  FourSimulated simulator;
  fulgor::DistributedEnvironment environment;
  environment.world_size = environment.local_world_size = 2;
  const fulgor::Devices devices(std::string("3,1"));
  const auto selected = simulator.parse_devices(devices);
  for (int64_t local_rank : {0, 1}) {
    environment.rank = environment.local_rank = local_rank;
    const auto setup = fulgor::detail::device_setup(simulator, devices, selected, environment);
    EXPECT_EQ(setup.index, local_rank == 0 ? 3 : 1);
    EXPECT_EQ(setup.local_rank, local_rank);
    EXPECT_EQ(setup.world_size, 2);
    EXPECT_EQ(setup.device, torch::Device(torch::kCPU));
  }
  // The built-in CPU's processes share its one device.
  auto cpu = fulgor::make_accelerator("cpu");
  environment.rank = environment.local_rank = 1;
  EXPECT_EQ(
      fulgor::detail::device_setup(*cpu, fulgor::Devices(2), cpu->parse_devices(fulgor::Devices(2)), environment).index,
      0);
}

}  // namespace
