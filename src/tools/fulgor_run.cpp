// fulgor-run: starts the processes of one node of a data-parallel job, as
// torchrun does, and keeps them together.
//
//   fulgor-run --nproc-per-node N [--nnodes M --node-rank R] [--master-addr A] [--master-port P]
//              [--grace-period S] [--max-restarts K] -- PROGRAM [ARGS...]
//
// Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR and MASTER_PORT, which fulgor's
// detect_distributed_environment() reads, TORCHELASTIC_RESTART_COUNT and
// TORCHELASTIC_MAX_RESTARTS as torchrun sets them, and, as torchrun does when
// it starts several processes and OMP_NUM_THREADS is unset, OMP_NUM_THREADS=1,
// so that the processes' intra-op thread pools do not overload the cores.
// SIGINT and SIGTERM sent to fulgor-run are passed on to them (a terminal's
// Ctrl-C already reaches them all). When a process exits non-zero or is
// killed, the others get SIGTERM and, after the grace period, SIGKILL; then,
// while restarts are left (Note [Restarts]), every process is started again,
// and otherwise fulgor-run exits with that process's status (128 + signal
// number when it was killed), after naming it on stderr.
// Exits 2 on a bad command line.
//
// It starts no LibTorch itself, so it links neither libfulgor nor LibTorch.

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "distributed/processes.h"

extern char** environ;

namespace {

struct Options {
  long nproc_per_node = 0;
  long nnodes = 1;
  long node_rank = 0;
  std::string master_addr = "127.0.0.1";
  long master_port = 0;  // 0: choose
  long grace_seconds = 30;
  long max_restarts = 0;
  std::vector<std::string> command;
};

struct UsageError {
  std::string message;
};

const char* const kUsage =
    "usage: fulgor-run --nproc-per-node N [--nnodes M --node-rank R] [--master-addr A] [--master-port P]\n"
    "                  [--grace-period SECONDS] [--max-restarts N] -- PROGRAM [ARGS...]\n";

long parse_number(const std::string& option, const std::string& value, long min, long max) {
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE || parsed < min || parsed > max)
    throw UsageError{
        fmt::format("{} '{}' is not accepted: expected a whole number from {} to {}", option, value, min, max)};
  return parsed;
}

// Sets the option `arg` (either spelling, torchrun's or ours) to `value`.
void set_option(Options& options, const std::string& arg, const std::string& value) {
  if (arg == "--nproc-per-node" || arg == "--nproc_per_node") {
    options.nproc_per_node = parse_number(arg, value, 1, 4096);
  } else if (arg == "--nnodes") {
    options.nnodes = parse_number(arg, value, 1, 100000);
  } else if (arg == "--node-rank" || arg == "--node_rank") {
    options.node_rank = parse_number(arg, value, 0, 100000);
  } else if (arg == "--master-addr" || arg == "--master_addr") {
    if (value.empty()) throw UsageError{"--master-addr '' is not accepted: expected a host name or address"};
    options.master_addr = value;
  } else if (arg == "--master-port" || arg == "--master_port") {
    options.master_port = parse_number(arg, value, 1, 65535);
  } else if (arg == "--grace-period") {
    options.grace_seconds = parse_number(arg, value, 0, 86400);
  } else if (arg == "--max-restarts" || arg == "--max_restarts") {
    options.max_restarts = parse_number(arg, value, 0, 100000);
  } else {
    throw UsageError{fmt::format("unknown option '{}'", arg)};
  }
}

// What no single option shows wrong.
void check_together(const Options& options) {
  if (options.nproc_per_node == 0) throw UsageError{"--nproc-per-node is required"};
  if (options.command.empty()) throw UsageError{"no program given after '--'"};
  if (options.node_rank >= options.nnodes)
    throw UsageError{fmt::format("--node-rank {} is not accepted: expected 0 to {} for --nnodes {}", options.node_rank,
                                 options.nnodes - 1, options.nnodes)};
  if (options.nnodes > 1 && options.master_port == 0)
    throw UsageError{"--master-port is required with --nnodes > 1: every node must use the same port"};
  if (options.nnodes > 1 && options.max_restarts > 0)
    throw UsageError{fmt::format(
        "--max-restarts {} is not accepted with --nnodes {}: expected 0, as fulgor-run has no rendezvous to "
        "restart the nodes together; restart the whole job instead (\"Restarts\" in docs/distributed.md)",
        options.max_restarts, options.nnodes)};
}

Options parse(int argc, char** argv) {
  Options options;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    std::string value;
    const size_t equals = arg.find('=');
    if (arg.rfind("--", 0) == 0 && equals != std::string::npos) {
      value = arg.substr(equals + 1);
      arg = arg.substr(0, equals);
    } else if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw UsageError{fmt::format("option {} needs a value", arg)};
    }
    set_option(options, arg, value);
  }
  for (; i < argc; ++i) options.command.push_back(argv[i]);
  check_together(options);
  return options;
}

long free_port() {
  const int port = fulgor::detail::free_port();
  if (port < 0) throw std::runtime_error(fmt::format("cannot find a free port: {}", std::strerror(errno)));
  return port;
}

std::string plural(long count, const char* noun) { return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s"); }

struct Child {
  long rank = 0;
  long local_rank = 0;
};

// The first process of a start that failed.
struct Failure {
  Child child;
  pid_t pid = 0;
  int status = 0;  // as waitpid gives it
};

// Note [Restarts]
// torchrun's rule (SimpleElasticAgent._invoke_run): when a process fails, the
// node's whole group is stopped and started again, up to --max-restarts
// times, each process reading in TORCHELASTIC_RESTART_COUNT how many restarts
// were made before it (0 at the first start), so that a program can resume
// from its checkpoint. After the last failure the job ends with it. What
// differs, and why:
//   - One node only. torchrun's agents meet again in a new rendezvous
//     generation; fulgor-run has no rendezvous, so a node that restarts alone
//     could find the other nodes' processes of the last start still waiting
//     at the master, mixing the two starts. --max-restarts is refused with
//     --nnodes > 1: a scheduler restarts a multi-node job as a whole.
//   - A failure is known when the process ends (SIGCHLD), not at torchrun's
//     next poll of its processes.
//   - fulgor-run exits with the failed process's status; torchrun with 1.
// As in torchrun, a SIGINT or SIGTERM sent to fulgor-run ends the job with no
// restart, and a process that succeeded before another failed runs again.

class Launcher {
 public:
  explicit Launcher(Options options) : options_(std::move(options)) {}

  int run() {
    // Signals are taken synchronously with sigtimedwait, so no handler races
    // with the bookkeeping; children get the original mask back before exec.
    sigset_t wanted = handled_signals();
    sigprocmask(SIG_BLOCK, &wanted, &original_mask_);
    for (long restarts = 0;; ++restarts) {
      if (!start_all(restarts)) return 1;
      supervise();
      if (!failure_) return received_signal_ != 0 ? 128 + received_signal_ : 0;
      if (received_signal_ != 0 || restarts == options_.max_restarts) return give_up(restarts);
      std::cerr << fmt::format("fulgor-run: restarting the {} of this node (restart {} of --max-restarts {})\n",
                               plural(options_.nproc_per_node, "rank"), restarts + 1, options_.max_restarts);
    }
  }

 private:
  static sigset_t handled_signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    return set;
  }

  // Starts every process of this node; false (having stopped those started)
  // when one cannot be.
  bool start_all(long restarts) {
    stopping_ = killed_ = false;
    failure_.reset();
    // fulgor-run's own choice is made again at each start: nothing holds the
    // port between two starts, so another program may have taken it.
    const long port = options_.master_port != 0 ? options_.master_port : free_port();
    for (long local = 0; local < options_.nproc_per_node; ++local) {
      const long rank = options_.node_rank * options_.nproc_per_node + local;
      const pid_t pid = start(child_environment(rank, local, port, restarts), rank);
      if (pid < 0) {
        std::cerr << fmt::format("fulgor-run: cannot start rank {}: {}\n", rank, std::strerror(errno));
        stop_all(SIGKILL);
        wait_for_all();
        return false;
      }
      children_[pid] = Child{rank, local};
    }
    return true;
  }

  // Runs the program as `rank` with `env`; the child's pid, or -1 with errno set.
  pid_t start(std::vector<std::string> env, long rank) {
    std::vector<char*> envp, argv;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    for (std::string& a : options_.command) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid != 0) return pid;
    sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
    execvpe(argv[0], argv.data(), envp.data());
    const std::string message =
        fmt::format("fulgor-run: cannot run '{}' as rank {}: {}\n", argv[0], rank, std::strerror(errno));
    ssize_t ignored = write(STDERR_FILENO, message.data(), message.size());
    (void)ignored;
    _exit(127);
  }

  std::vector<std::string> child_environment(long rank, long local, long port, long restarts) const {
    static const char* const ours[] = {"RANK",
                                       "LOCAL_RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "TORCHELASTIC_RESTART_COUNT",
                                       "TORCHELASTIC_MAX_RESTARTS"};
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (const char* o : ours) replaced = replaced || name == o;
      if (!replaced) env.push_back(entry);
    }
    env.push_back(fmt::format("RANK={}", rank));
    env.push_back(fmt::format("LOCAL_RANK={}", local));
    env.push_back(fmt::format("WORLD_SIZE={}", options_.nproc_per_node * options_.nnodes));
    env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", options_.nproc_per_node));
    env.push_back(fmt::format("GROUP_RANK={}", options_.node_rank));
    env.push_back(fmt::format("MASTER_ADDR={}", options_.master_addr));
    env.push_back(fmt::format("MASTER_PORT={}", port));
    env.push_back(fmt::format("TORCHELASTIC_RESTART_COUNT={}", restarts));
    env.push_back(fmt::format("TORCHELASTIC_MAX_RESTARTS={}", options_.max_restarts));
    if (options_.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) env.push_back("OMP_NUM_THREADS=1");
    return env;
  }

  // Names the failure that ends the job and returns fulgor-run's exit status.
  int give_up(long restarts) const {
    const std::string why_not_more =
        restarts < options_.max_restarts
            ? fmt::format("; no restart after signal {} ({})", received_signal_, strsignal(received_signal_))
            : "";
    std::cerr << fmt::format(
        "fulgor-run: giving up after {} (--max-restarts {}{}): rank {} (local rank {}, pid {}) {}\n",
        plural(restarts, "restart"), options_.max_restarts, why_not_more, failure_->child.rank,
        failure_->child.local_rank, failure_->pid, fulgor::detail::describe_wait_status(failure_->status));
    const int code = fulgor::detail::exit_code_of(failure_->status);
    return code == 0 ? 1 : code;
  }

  void stop_all(int signal) {
    for (const auto& child : children_) kill(child.first, signal);
  }

  void wait_for_all() {
    int status = 0;
    while (!children_.empty()) {
      const pid_t pid = waitpid(-1, &status, 0);
      if (pid < 0 && errno != EINTR) break;
      children_.erase(pid);
    }
  }

  void begin_stopping(int signal) {
    start_grace_period();
    stop_all(signal);
  }

  // The processes have until the deadline to end before they are killed.
  void start_grace_period() {
    if (!stopping_) deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(options_.grace_seconds);
    stopping_ = true;
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = children_.find(pid);
      if (it == children_.end()) continue;
      const Child child = it->second;
      children_.erase(it);
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok || stopping_) continue;
      failure_ = Failure{child, pid, status};
      std::cerr << fmt::format("fulgor-run: rank {} (local rank {}, pid {}) {}; stopping the other {}\n", child.rank,
                               child.local_rank, pid, fulgor::detail::describe_wait_status(status),
                               plural(static_cast<long>(children_.size()), "rank"));
      begin_stopping(SIGTERM);
    }
  }

  // Waits until every process has ended, stopping them all when one fails or
  // fulgor-run is sent a signal.
  void supervise() {
    const sigset_t wanted = handled_signals();
    while (!children_.empty()) {
      reap();
      if (children_.empty()) break;
      timespec wait_for{1, 0};
      if (stopping_) {
        const auto left = deadline_ - std::chrono::steady_clock::now();
        if (left <= std::chrono::steady_clock::duration::zero()) {
          if (!killed_)
            std::cerr << fmt::format("fulgor-run: {} still running after the {} s grace period; killing\n",
                                     plural(static_cast<long>(children_.size()), "rank"), options_.grace_seconds);
          killed_ = true;
          stop_all(SIGKILL);
        } else {
          const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
          wait_for = {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
        }
      }
      siginfo_t info{};
      const int signal = sigtimedwait(&wanted, &info, &wait_for);
      if (signal == SIGINT || signal == SIGTERM) take_signal(signal, info);
    }
  }

  void take_signal(int signal, const siginfo_t& info) {
    received_signal_ = signal;
    // A terminal's Ctrl-C (sent by the kernel) reached the whole foreground
    // process group, the ranks included; pass on only what was sent to
    // fulgor-run alone, so no rank gets it twice.
    if (info.si_code == SI_KERNEL)
      start_grace_period();
    else
      begin_stopping(signal);
  }

  Options options_;
  sigset_t original_mask_{};
  std::map<pid_t, Child> children_;
  bool stopping_ = false;
  bool killed_ = false;
  std::optional<Failure> failure_;
  int received_signal_ = 0;
  std::chrono::steady_clock::time_point deadline_{};
};

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "fulgor-run: " << e.message << '\n' << kUsage;
    return 2;
  }
  try {
    return Launcher(std::move(options)).run();
  } catch (const std::exception& e) {
    std::cerr << "fulgor-run: " << e.what() << '\n';
    return 1;
  }
}
