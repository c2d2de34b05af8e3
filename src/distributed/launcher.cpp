#include "distributed/launcher.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <mutex>
#include <thread>
#include <vector>

#include "distributed/processes.h"
#include "fulgor/core/error.h"

extern char** environ;

namespace fulgor::detail {
namespace {

// How long the other ranks have to end after SIGTERM before SIGKILL.
constexpr auto kGracePeriod = std::chrono::seconds(10);
constexpr size_t kMaxRanks = 1024;

// The ranks' process ids, for the signal handler: lock-free atomics are what a
// handler may read. 0: not started or ended.
std::array<std::atomic<pid_t>, kMaxRanks> g_pids{};

struct Rank {
  pid_t pid = 0;
  bool ended = false;
};

struct Launcher {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Rank> ranks;  // index: rank
  // The first rank this process started: 1, as it is rank 0 itself, or 0 when
  // it supervises restarts (Note [Restarting the Trainer's own ranks]).
  size_t first_child = 1;
  std::vector<std::thread> threads;
  bool joined = false;
  bool stopping = false;
  std::string failure;
  int failure_code = 0;
};

// Never destroyed: its threads are joined by wait_for_ranks at exit.
Launcher& state() {
  static auto* launcher = new Launcher;
  return *launcher;
}

// The program's arguments as the kernel keeps them: what Lightning's
// launcher reads from sys.argv.
std::vector<std::string> command_line() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> arguments;
  for (size_t start = 0; start < all.size();) {
    const size_t end = all.find('\0', start);
    arguments.push_back(all.substr(start, end - start));
    start = end == std::string::npos ? all.size() : end + 1;
  }
  if (arguments.empty())
    throw DistributedError(
        "cannot start the other ranks: /proc/self/cmdline gives no command line to run again; start the ranks with "
        "fulgor-run, torchrun or srun instead");
  return arguments;
}

// Lightning's _set_num_threads_if_needed: the cores shared among the ranks.
// More ranks than cores is allowed (a test of a job on a small machine) but
// said, since every rank then waits for a core.
void share_cores(int64_t processes) {
  cpu_set_t cpus;
  const int64_t cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  if (processes > cores)
    std::cerr << fmt::format(
        "fulgor: starting {} ranks on {} CPU core{}: the ranks take turns on the cores, and "
        "training runs slower than on fewer ranks\n",
        processes, cores, cores == 1 ? "" : "s");
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  const int64_t threads = std::max<int64_t>(1, cores / processes);
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  at::set_num_threads(static_cast<int>(threads));
}

// MASTER_ADDR and MASTER_PORT as the user set them, as in Lightning.
void set_rank_zero_variables(int64_t processes, const std::string& address, const std::string& port) {
  const std::string world = std::to_string(processes);
  setenv("RANK", "0", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("GROUP_RANK", "0", 1);
  setenv("WORLD_SIZE", world.c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", world.c_str(), 1);
  setenv("MASTER_ADDR", address.c_str(), 1);
  setenv("MASTER_PORT", port.c_str(), 1);
}

// Rank 0's variables with RANK and LOCAL_RANK of `rank`.
std::vector<std::string> environment_of(int64_t rank) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind("RANK=", 0) != 0 && entry.rfind("LOCAL_RANK=", 0) != 0) env.push_back(entry);
  }
  env.push_back(fmt::format("RANK={}", rank));
  env.push_back(fmt::format("LOCAL_RANK={}", rank));
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  for (auto& s : strings) result.push_back(s.data());
  result.push_back(nullptr);
  return result;
}

// Between fork and exec only async-signal-safe calls: the rank dies with the
// thread that started it, which lives as long as rank 0.
[[noreturn]] void become_rank(char* const* argv, char* const* envp, pid_t parent, const std::string& failed) {
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  execve("/proc/self/exe", argv, envp);
  ssize_t ignored = write(STDERR_FILENO, failed.data(), failed.size());
  (void)ignored;
  _exit(127);
}

void stop_others_locked(Launcher& l);

void on_rank_end(int64_t rank, int status) {
  auto& l = state();
  std::lock_guard<std::mutex> lock(l.mutex);
  g_pids[rank] = 0;
  l.ranks[rank].ended = true;
  const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (failed && !l.stopping && l.failure.empty()) {
    l.failure = fmt::format("rank {} (pid {}) {}", rank, l.ranks[rank].pid, describe_wait_status(status));
    l.failure_code = std::max(1, exit_code_of(status));
    if (!l.joined) {
      // Rank 0 waits in the rendezvous for a rank that will never come.
      for (auto& pid : g_pids)
        if (pid > 0) kill(pid, SIGKILL);
      std::cerr << fmt::format("fulgor: {} before the job started; ending the job\n", l.failure);
      std::cout.flush();
      _exit(l.failure_code);
    }
    std::cerr << fmt::format("fulgor: {}; stopping the other ranks\n", l.failure);
    stop_others_locked(l);
  }
  l.changed.notify_all();
}

bool all_ended(const Launcher& l) {
  for (size_t r = l.first_child; r < l.ranks.size(); ++r)
    if (!l.ranks[r].ended) return false;
  return true;
}

// SIGTERM now, SIGKILL to those left after the grace period.
void stop_others_locked(Launcher& l) {
  if (l.stopping) return;
  l.stopping = true;
  for (auto& pid : g_pids)
    if (pid > 0) kill(pid, SIGTERM);
  l.threads.emplace_back([&l] {
    std::unique_lock<std::mutex> lock(l.mutex);
    if (l.changed.wait_for(lock, kGracePeriod, [&] { return all_ended(l); })) return;
    for (auto& pid : g_pids)
      if (pid > 0) kill(pid, SIGKILL);
  });
}

// Returns once every rank started has ended and every thread waiting for
// one (or for the grace period) is done.
void join_threads(Launcher& l) {
  for (;;) {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(l.mutex);
      threads.swap(l.threads);
    }
    if (threads.empty()) break;
    for (auto& t : threads) t.join();
  }
}

// At exit rank 0 waits for the ranks it started; a rank's failure is the
// job's exit status, as with fulgor-run and torchrun.
void wait_for_ranks() {
  auto& l = state();
  join_threads(l);
  if (l.failure_code != 0) {
    std::cout.flush();
    _exit(l.failure_code);
  }
}

pid_t start_rank(int64_t rank, std::vector<std::string> argv, std::vector<std::string> env) {
  auto& l = state();
  std::promise<pid_t> started;
  auto pid = started.get_future();
  const pid_t parent = getpid();
  std::thread waiter(
      [rank, parent, argv = std::move(argv), env = std::move(env), started = std::move(started)]() mutable {
        auto argv_pointers = pointers(argv);
        auto env_pointers = pointers(env);
        const std::string failed = fmt::format("fulgor: cannot run '{}' again as rank {}\n", argv[0], rank);
        const pid_t child = fork();
        if (child == 0) become_rank(argv_pointers.data(), env_pointers.data(), parent, failed);
        const int error = errno;
        if (child > 0) {
          std::lock_guard<std::mutex> lock(state().mutex);
          state().ranks[rank].pid = child;
          g_pids[rank] = child;
        }
        started.set_value(child < 0 ? -error : child);
        if (child < 0) {
          std::lock_guard<std::mutex> lock(state().mutex);
          state().ranks[rank].ended = true;
          return;
        }
        int status = 0;
        while (waitpid(child, &status, 0) < 0)
          if (errno != EINTR) return;
        on_rank_end(rank, status);
      });
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    l.threads.push_back(std::move(waiter));
  }
  return pid.get();
}

// Note [Restarting the Trainer's own ranks]
// fulgor-run's --max-restarts (Note [Restarts] in src/tools/fulgor_run.cpp)
// for the ranks a program starts itself: with FULGOR_MAX_RESTARTS=N (N > 0)
// in its environment, the process that would become rank 0 supervises the
// job instead. It runs the program again as every rank, rank 0 included,
// each with TORCHELASTIC_RESTART_COUNT (the restarts made before it started)
// and TORCHELASTIC_MAX_RESTARTS; when a rank fails it stops the others as
// without restarts (SIGTERM, then SIGKILL after the grace period) and starts
// them all again, up to N times, each start on a port of its own unless
// MASTER_PORT was given. Then it exits with the job's status: 0, the failed
// rank's after the last restart, or 128 + the signal that ended the job. It
// never returns to the program, whose every rank ran the rest of it. Rank 0
// cannot stay in this process, as it does without restarts: a failure may
// leave its process group and its module unusable, and only a new process
// starts clean. A SIGINT or SIGTERM sent to the supervisor is passed on to
// the ranks and ends the job without a restart, as in fulgor-run.

constexpr const char* kMaxRestartsVariable = "FULGOR_MAX_RESTARTS";

// The signal (SIGINT or SIGTERM) that ended the supervised job; 0 for none.
std::atomic<int> g_supervisor_signal{0};

extern "C" void on_supervisor_signal(int signal, siginfo_t* info, void*) {
  g_supervisor_signal = signal;
  forward_signal_to_launched_ranks(signal, info);
}

// A handler rather than a blocked mask: LibTorch's threads, which the mask
// of this one does not cover, may be the ones the kernel hands a signal to.
void trap_supervisor_signals() {
  struct sigaction action {};
  action.sa_sigaction = on_supervisor_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_SIGINFO;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

[[noreturn]] void exit_job(int code) {
  std::cout.flush();
  std::cerr.flush();
  _exit(code);
}

// FULGOR_MAX_RESTARTS, 0 when unset.
int64_t self_launch_max_restarts() {
  const char* value = std::getenv(kMaxRestartsVariable);
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long long restarts = std::strtoll(value, &end, 10);
  if (*end != '\0' || errno != 0 || restarts < 0)
    throw ConfigError(
        fmt::format("{}='{}' is not accepted: expected how many times to restart the ranks after a "
                    "failure, a whole number from 0 (unset: 0)",
                    kMaxRestartsVariable, value));
  return restarts;
}

// Starts every rank of the job for its start after `restarts` restarts.
void start_every_rank(int64_t processes, int64_t restarts, const std::vector<std::string>& argv, bool port_given) {
  auto& l = state();
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    l.ranks.assign(static_cast<size_t>(processes), Rank{});
    l.first_child = 0;
    // No rank of this process waits in the rendezvous for a failed one.
    l.joined = true;
    l.stopping = false;
    l.failure.clear();
    l.failure_code = 0;
  }
  // Nothing holds a chosen port between two starts: another program may have taken it.
  const int port = port_given ? 0 : free_port();
  if (port > 0) setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(restarts).c_str(), 1);
  for (int64_t rank = 0; rank < processes; ++rank) {
    const pid_t pid = start_rank(rank, argv, environment_of(rank));
    if (pid > 0) continue;
    std::cerr << fmt::format("fulgor: cannot start rank {} of {}: {}\n", rank, processes, std::strerror(-pid));
    stop_launched_ranks();
    join_threads(l);
    exit_job(1);
  }
}

// Names the failure that ends the job and the restarts made, as fulgor-run does.
void say_giving_up(int64_t restarts, int64_t max_restarts, int signal, const std::string& failure) {
  const std::string why_not_more =
      signal != 0 ? fmt::format("; no restart after signal {} ({})", signal, strsignal(signal)) : "";
  std::cerr << fmt::format("fulgor: giving up after {} restart{} ({}={}{}): {}\n", restarts, restarts == 1 ? "" : "s",
                           kMaxRestartsVariable, max_restarts, why_not_more, failure);
}

// Note [Restarting the Trainer's own ranks].
[[noreturn]] void supervise_restarts(int64_t processes, int64_t max_restarts, const std::vector<std::string>& argv,
                                     bool port_given) {
  trap_supervisor_signals();
  setenv("TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts).c_str(), 1);
  auto& l = state();
  for (int64_t restarts = 0;; ++restarts) {
    start_every_rank(processes, restarts, argv, port_given);
    join_threads(l);
    const int signal = g_supervisor_signal;
    if (l.failure.empty()) exit_job(signal != 0 ? 128 + signal : 0);
    if (signal != 0 || restarts == max_restarts) {
      say_giving_up(restarts, max_restarts, signal, l.failure);
      exit_job(l.failure_code);
    }
    std::cerr << fmt::format("fulgor: restarting the {} ranks (restart {} of {}={})\n", processes, restarts + 1,
                             kMaxRestartsVariable, max_restarts);
  }
}

}  // namespace

DistributedEnvironment launch_ranks(int64_t processes) {
  auto& l = state();
  if (processes < 2 || static_cast<size_t>(processes) > kMaxRanks)
    throw DistributedError(fmt::format("cannot start {} ranks: expected 2 to {}", processes, kMaxRanks));
  if (launched_ranks()) throw DistributedError("this process has already started the ranks of a job");
  const int64_t max_restarts = self_launch_max_restarts();
  const auto argv = command_line();
  const char* address = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  const int chosen = port ? 0 : free_port();
  if (chosen < 0)
    throw DistributedError(
        fmt::format("cannot start the other ranks: no free port for rank 0: {}", std::strerror(errno)));
  set_rank_zero_variables(processes, address ? address : "127.0.0.1", port ? port : std::to_string(chosen));
  share_cores(processes);
  if (max_restarts > 0) supervise_restarts(processes, max_restarts, argv, port != nullptr);
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    l.ranks.assign(static_cast<size_t>(processes), Rank{});
    l.ranks[0].pid = getpid();
  }
  std::atexit(wait_for_ranks);
  for (int64_t rank = 1; rank < processes; ++rank) {
    const pid_t pid = start_rank(rank, argv, environment_of(rank));
    if (pid < 0) {
      stop_launched_ranks();
      throw DistributedError(fmt::format("cannot start rank {} of {}: {}", rank, processes, std::strerror(-pid)));
    }
  }
  return detect_distributed_environment();
}

bool launched_ranks() {
  auto& l = state();
  std::lock_guard<std::mutex> lock(l.mutex);
  return !l.ranks.empty();
}

void launched_ranks_joined() {
  auto& l = state();
  std::lock_guard<std::mutex> lock(l.mutex);
  l.joined = true;
}

std::string launched_rank_failure(double wait_seconds) {
  auto& l = state();
  std::unique_lock<std::mutex> lock(l.mutex);
  if (l.ranks.empty()) return {};
  l.changed.wait_for(lock, std::chrono::duration<double>(wait_seconds),
                     [&] { return !l.failure.empty() || all_ended(l); });
  return l.failure;
}

void stop_launched_ranks() {
  auto& l = state();
  std::lock_guard<std::mutex> lock(l.mutex);
  if (!l.ranks.empty()) stop_others_locked(l);
}

void forward_signal_to_launched_ranks(int signal, const siginfo_t* info) {
  // A terminal's Ctrl-C went to the whole foreground process group, the
  // ranks included: passing it on would make it their second.
  if (info != nullptr && info->si_code == SI_KERNEL) return;
  for (auto& pid : g_pids) {
    const pid_t p = pid.load();
    if (p > 0) kill(p, signal);
  }
}

}  // namespace fulgor::detail
