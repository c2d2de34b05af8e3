// Nothing lost under random faults: a job of two Gloo ranks under
// fulgor-run --max-restarts, whose ranks are killed (SIGKILL) at random
// moments, ends as the same job run without faults, bit for bit, and leaves
// only complete checkpoints, no temporary file and no process behind.
//
// Note [Fault injection]
// The job is fault_worker.cpp: FaultNet fitted with strategy "ddp" for
// epochs of 8 steps (6 epochs for 20 faults, one more for every 4 faults
// beyond, so that most faults find steps to land in), a checkpoint and
// last.ckpt saved after every step, resumed with ckpt_path "last" at every
// start. The injector kills one rank, chosen
// at random, per start of the job, then waits for fulgor-run's next start,
// until it has made its faults; the ranks wait at the end (OUTDIR/release) so
// that the job cannot end before that. Each fault is one of three kinds:
//   - "start": within 0.4 s of both ranks of a start having begun, which is
//     while they load, meet at the rendezvous and restore the checkpoint;
//   - "write": rank 0 is killed as soon as it creates the temporary file of
//     a checkpoint (inotify), once the job has saved a step drawn at random
//     (a "training" fault instead when no write comes: the fit has ended);
//   - "training": once the job has saved a step drawn at random (and at least
//     one step since the start), plus up to 10 ms, about a step: in a
//     step, a collective (rank 1 waits there while rank 0 writes), a write,
//     or after the fit (writing the results, waiting).
// The target steps rise over the faults, so that they cover the whole fit,
// its end included. After a quarter of the faults, drawn at random, the other
// rank is killed too within 0.1 s, while fulgor-run stops it.
// The kill times depend on the machine; the seed fixes the choices (kind,
// rank, target step, delay) and is printed, with FULGOR_FAULT_SEED to set it.
// Temporaries that the faults leave are counted when the next start begins,
// before its first save removes them: each one is a write that a kill cut
// short. The job must then end with exit status 0 after exactly one restart
// per fault, every failure a SIGKILL (no rank failed by itself), and:
//   - each rank's parameters, Adam moments and step counts, and loop counters
//     equal the uninterrupted run's (torch::equal);
//   - every .ckpt file left reads as a checkpoint and loads into the module;
//   - no temporary file is left anywhere in the job's folder;
//   - no process any start recorded is still running.
// CI runs 20 faults; FULGOR_SOAK_FAULTS=N runs N (docs/distributed.md,
// "Under random faults").

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "fulgor/checkpoint/checkpoint.h"
#include "support/fault_scenario.h"
#include "support/spawn.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using fulgor::test::Child;

// A start of one rank, as the worker recorded it.
struct JobStart {
  long restart = -1;
  long rank = -1;
  pid_t pid = 0;
};

std::vector<JobStart> job_starts(const std::string& out) {
  std::istringstream lines(fulgor::test::read_text(out + "/pids"));
  std::vector<JobStart> starts;
  for (JobStart s; lines >> s.restart >> s.rank >> s.pid;) starts.push_back(s);
  return starts;
}

// The pids of start `restart`'s two ranks, once both have begun.
std::optional<std::array<pid_t, 2>> ranks_of(const std::string& out, long restart) {
  std::array<pid_t, 2> pids{0, 0};
  for (const JobStart& s : job_starts(out))
    if (s.restart == restart && (s.rank == 0 || s.rank == 1)) pids[s.rank] = s.pid;
  if (pids[0] == 0 || pids[1] == 0) return std::nullopt;
  return pids;
}

// The step of the newest step checkpoint saved ("epoch=E-step=S.ckpt"), or -1.
long saved_step(const std::string& out) {
  static const std::regex name("epoch=\\d+-step=(\\d+)\\.ckpt");
  long step = -1;
  std::error_code ec;
  for (auto it = fs::directory_iterator(fulgor::test::fault_checkpoint_dir(out), ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::smatch m;
    const std::string file = it->path().filename().string();
    if (std::regex_match(file, m, name)) step = std::max(step, std::stol(m[1]));
  }
  return step;
}

bool is_temporary(const fs::path& file) {
  const std::string name = file.filename().string();
  return !name.empty() && name[0] == '.' && name.find(".tmp.") != std::string::npos;
}

// Every temporary checkpoint file under `dir`, at any depth.
std::set<std::string> temporaries(const std::string& dir) {
  std::set<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (is_temporary(it->path())) found.insert(it->path().string());
  return found;
}

// Whether `pid` is a process that runs with `out` in its command line (a pid
// that another program took since is not).
bool still_running(pid_t pid, const std::string& out) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::string cmdline = fulgor::test::read_text("/proc/" + std::to_string(pid) + "/cmdline");
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  return cmdline.find(out) != std::string::npos;
}

// fulgor-run with the worker; the worker ends when this process has gone
// (FULGOR_FAULT_TEST_PID), so that a test killed by its timeout leaves no job.
std::vector<std::string> job_argv(const std::string& out, long epochs, long max_restarts) {
  return {FULGOR_RUN_PATH,
          "--nproc-per-node",
          "2",
          "--max-restarts",
          std::to_string(max_restarts),
          "--grace-period",
          "5",
          "--",
          FULGOR_FAULT_WORKER,
          out,
          std::to_string(epochs)};
}

std::map<std::string, std::string> watched() { return {{"FULGOR_FAULT_TEST_PID", std::to_string(getpid())}}; }

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

struct Injected {
  long faults = 0, start_kind = 0, write_kind = 0, training_kind = 0, of_rank0 = 0;
  long second_kills = 0;        // of the other rank, soon after
  long interrupted_writes = 0;  // temporaries the faults left
};

// Note [Fault injection]: kills one rank per start of the job in `out`, run
// by `job`, `faults` times; false with `why` set when the job stopped
// answering as expected.
class Injector {
 public:
  Injector(Child& job, std::string out, long steps, uint64_t seed)
      : job_(job), out_(std::move(out)), steps_(steps), random_(seed) {}

  bool run(long faults, Clock::time_point deadline, std::string& why) {
    // Rising targets, so that the training faults cover the whole fit.
    std::vector<long> targets;
    std::uniform_int_distribution<long> step(1, steps_);
    for (long i = 0; i < faults; ++i) targets.push_back(step(random_));
    std::sort(targets.begin(), targets.end());
    std::discrete_distribution<int> kind({25, 30, 45});  // start, write, training
    std::bernoulli_distribution rank0(0.5), second_kill(0.25);
    std::uniform_int_distribution<int> second_delay(0, 100);
    std::uniform_int_distribution<int> start_delay(0, 400), training_delay(0, 10);
    for (long restart = 0; restart < faults; ++restart) {
      const auto pids = wait_for_start(restart, deadline);
      if (!pids) return why = "start " + std::to_string(restart) + " did not begin", false;
      count_new_temporaries();
      // Faults 1 and 2 are drawn as of a start and of a write, so that each
      // kind occurs. Every draw is made whatever happens, so that the seed
      // gives the same choices whatever the timing.
      const int chosen = restart == 1 ? 0 : restart == 2 ? 1 : kind(random_);
      int rank = rank0(random_) ? 0 : 1;
      const int delay = chosen == 0 ? start_delay(random_) : training_delay(random_);
      const bool also_other = second_kill(random_);
      const int other_delay = second_delay(random_);
      if (chosen == 0) {
        sleep_ms(delay);
        ++injected_.start_kind;
      } else {
        // At least one step into this start, so the kill is in the fit, not
        // in the start (the fit's end excepted).
        const long target = std::min(std::max(targets[restart], saved_step(out_) + 1), steps_);
        while (saved_step(out_) < target && Clock::now() < deadline && job_.running()) sleep_ms(1);
        if (chosen == 1 && wait_for_write(deadline)) {
          rank = 0;  // the writer
          ++injected_.write_kind;
        } else {
          sleep_ms(delay);
          ++injected_.training_kind;
        }
      }
      if (!job_.running() || Clock::now() > deadline)
        return why = "the job ended or ran out of time before fault " + std::to_string(restart + 1), false;
      kill((*pids)[rank], SIGKILL);
      injected_.of_rank0 += rank == 0;
      ++injected_.faults;
      if (also_other) {
        // The other rank, while fulgor-run stops it: in its stop by the
        // signal (the Trainer saves last.ckpt then), or in a collective.
        sleep_ms(other_delay);
        kill((*pids)[1 - rank], SIGKILL);
        ++injected_.second_kills;
      }
    }
    if (!wait_for_start(faults, deadline)) return why = "the start after the last fault did not begin", false;
    count_new_temporaries();
    return true;
  }
  const Injected& injected() const { return injected_; }

 private:
  std::optional<std::array<pid_t, 2>> wait_for_start(long restart, Clock::time_point deadline) {
    for (;;) {
      if (auto pids = ranks_of(out_, restart)) return pids;
      if (!job_.running() || Clock::now() > deadline) return std::nullopt;
      sleep_ms(2);
    }
  }
  // Waits until rank 0 creates a checkpoint's temporary file; false at once
  // when the fit has saved its last step, and when none came within 10 s (a
  // start that ends in a loaded machine's rendezvous).
  bool wait_for_write(Clock::time_point deadline) {
    if (saved_step(out_) >= steps_) return false;
    const int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) return false;
    bool created = false;
    const auto until = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    if (inotify_add_watch(fd, fulgor::test::fault_checkpoint_dir(out_).c_str(), IN_CREATE) >= 0) {
      alignas(inotify_event) char events[4096];
      pollfd ready{fd, POLLIN, 0};
      while (!created && Clock::now() < until) {
        if (poll(&ready, 1, 10) <= 0) continue;
        const ssize_t n = read(fd, events, sizeof(events));
        for (ssize_t at = 0; at < n;) {
          const auto* event = reinterpret_cast<const inotify_event*>(events + at);
          created = created || (event->len > 0 && is_temporary(event->name));
          at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
        }
      }
    }
    close(fd);
    return created;
  }
  // A start has begun and not yet saved: what temporaries there are, the
  // faults left (a start's first save removes them).
  void count_new_temporaries() {
    for (const std::string& file : temporaries(out_)) injected_.interrupted_writes += seen_.insert(file).second;
  }
  static void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

  Child& job_;
  std::string out_;
  long steps_;  // the fit's
  std::mt19937_64 random_;
  Injected injected_;
  std::set<std::string> seen_;
};

long fault_count() {
  const char* soak = std::getenv("FULGOR_SOAK_FAULTS");
  return soak ? std::stol(soak) : 20;
}

uint64_t fault_seed() {
  const char* seed = std::getenv("FULGOR_FAULT_SEED");
  return seed ? std::stoull(seed) : std::random_device{}();
}

void expect_loadable_checkpoints(const std::string& out) {
  long files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(out)) {
    if (entry.path().extension() != ".ckpt") continue;
    ++files;
    fulgor::test::FaultNet module(0);
    EXPECT_NO_THROW({
      fulgor::read_checkpoint_file(entry.path().string());
      fulgor::read_checkpoint_meta(entry.path().string());
      fulgor::load_module_weights(module, entry.path().string());
    }) << entry.path();
  }
  EXPECT_GT(files, 0) << "no checkpoint left in " << out;
}

TEST(FaultInjection, NothingLostUnderRandomKills) {
  const long faults = fault_count();
  // Two steps or more for each fault in the fit: 6 epochs of 8 steps for 20.
  const long epochs = std::max(6L, faults / 4 + 1);
  const uint64_t seed = fault_seed();
  std::cout << "fault injection: " << faults << " faults, FULGOR_FAULT_SEED=" << seed << std::endl;
  RecordProperty("seed", std::to_string(seed));

  // The uninterrupted run.
  fulgor::test::TempDir reference;
  std::ofstream(reference / "release").close();
  // Made before the job, for the injector to watch from its first start.
  fs::create_directories(fulgor::test::fault_checkpoint_dir(reference.str()));
  const auto reference_began = Clock::now();
  Child clean(job_argv(reference.str(), epochs, 0), watched(), reference / "log");
  ASSERT_TRUE(fulgor::test::exited_with(clean.wait(std::chrono::seconds(60)), 0)) << clean.log();
  const double reference_s = std::chrono::duration<double>(Clock::now() - reference_began).count();

  // The same job under faults: about 2 s a fault on two cores. The bounds keep
  // the short form (20 faults) within ctest's 300 s: 60 + 140 + 30 s at most.
  fulgor::test::TempDir faulted;
  fs::create_directories(fulgor::test::fault_checkpoint_dir(faulted.str()));
  const auto began = Clock::now();
  const auto deadline = began + std::chrono::seconds(60 + 4 * faults);
  // Exactly one restart a fault: a rank that failed by itself ends the job.
  Child job(job_argv(faulted.str(), epochs, faults), watched(), faulted / "log");
  Injector injector(job, faulted.str(), epochs * fulgor::test::kFaultStepsPerEpoch, seed);
  std::string why;
  const bool injected_all = injector.run(faults, deadline, why);
  std::ofstream(faulted / "release").close();
  const auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline - Clock::now());
  const auto status = job.wait(std::max(left, std::chrono::seconds(30)));
  const double wall_s = std::chrono::duration<double>(Clock::now() - began).count();
  const std::string log = job.log();
  const Injected& done = injector.injected();
  std::cout << "fault injection: " << done.faults << " faults (" << done.start_kind << " during a start, "
            << done.write_kind << " at a checkpoint write, " << done.training_kind << " during the fit or after it; "
            << done.of_rank0 << " of rank 0; " << done.second_kills << " followed by a kill of the other rank), "
            << done.interrupted_writes << " interrupted checkpoint writes, "
            << occurrences(log, "restarting the 2 ranks") << " restarts, "
            << occurrences(log, "still running after the") << " ranks killed after the grace period, " << wall_s
            << " s (uninterrupted run " << reference_s << " s)" << std::endl;
  ASSERT_TRUE(injected_all) << why << " (seed " << seed << ")\n" << log;
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << "seed " << seed << "\n" << log;
  EXPECT_EQ(occurrences(log, "restarting the 2 ranks"), static_cast<size_t>(faults)) << log;
  EXPECT_EQ(occurrences(log, "was killed by signal 9"), static_cast<size_t>(faults))
      << "every failure must be an injected kill (seed " << seed << ")\n"
      << log;

  for (int rank = 0; rank < 2; ++rank) {
    const auto expected = fulgor::test::load_tensors(fulgor::test::fault_result_path(reference.str(), rank),
                                                     fulgor::test::fault_result_names());
    const auto actual = fulgor::test::load_tensors(fulgor::test::fault_result_path(faulted.str(), rank),
                                                   fulgor::test::fault_result_names());
    for (const auto& [name, tensor] : expected)
      EXPECT_TRUE(torch::equal(actual.at(name), tensor))
          << name << " of rank " << rank << " differs from the uninterrupted run's (seed " << seed
          << "): " << actual.at(name) << " against " << tensor;
  }
  const auto counters = fulgor::test::load_tensors(fulgor::test::fault_result_path(reference.str(), 0), {"counters"});
  EXPECT_EQ(counters.at("counters")[0].item<int64_t>(), epochs * fulgor::test::kFaultStepsPerEpoch);

  expect_loadable_checkpoints(faulted.str());
  EXPECT_EQ(temporaries(faulted.str()), std::set<std::string>{}) << "seed " << seed;
  const std::vector<JobStart> starts = job_starts(faulted.str());
  EXPECT_EQ(starts.size(), static_cast<size_t>(2 * (faults + 1)));
  for (const JobStart& start : starts) {
    const auto gone_by = Clock::now() + std::chrono::seconds(10);  // an orphan's reaping by init
    while (still_running(start.pid, faulted.str()) && Clock::now() < gone_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(still_running(start.pid, faulted.str()))
        << "rank " << start.rank << " of start " << start.restart << " (pid " << start.pid << ") is left";
  }
}

}  // namespace
