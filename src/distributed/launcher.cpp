#include "launcher.h"

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

#include "fulgor/core/error.h"
#include "processes.h"

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
  std::vector<Rank> ranks;  // index: rank; rank 0 is this process
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
  for (size_t r = 1; r < l.ranks.size(); ++r)
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

// At exit rank 0 waits for the ranks it started; a rank's failure is the
// job's exit status, as with fulgor-run and torchrun.
void wait_for_ranks() {
  auto& l = state();
  for (;;) {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(l.mutex);
      threads.swap(l.threads);
    }
    if (threads.empty()) break;
    for (auto& t : threads) t.join();
  }
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

}  // namespace

DistributedEnvironment launch_ranks(int64_t processes) {
  auto& l = state();
  if (processes < 2 || static_cast<size_t>(processes) > kMaxRanks)
    throw DistributedError(fmt::format("cannot start {} ranks: expected 2 to {}", processes, kMaxRanks));
  if (launched_ranks()) throw DistributedError("this process has already started the ranks of a job");
  const auto argv = command_line();
  const char* address = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  const int chosen = port ? 0 : free_port();
  if (chosen < 0)
    throw DistributedError(
        fmt::format("cannot start the other ranks: no free port for rank 0: {}", std::strerror(errno)));
  set_rank_zero_variables(processes, address ? address : "127.0.0.1", port ? port : std::to_string(chosen));
  share_cores(processes);
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
