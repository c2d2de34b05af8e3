// fulgor-run: starts the processes of one node of a data-parallel job, as
// torchrun does, and keeps them together.
//
//   fulgor-run --nproc-per-node N [--nnodes M --node-rank R]
//              [--master-addr A] [--master-port P] [--grace-period S] -- PROGRAM [ARGS...]
//
// Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR and MASTER_PORT, which fulgor's
// detect_distributed_environment() reads, and, as torchrun does when it starts
// several processes and OMP_NUM_THREADS is unset, OMP_NUM_THREADS=1, so that
// the processes' intra-op thread pools do not overload the cores. SIGINT and SIGTERM sent to fulgor-run
// are passed on to them (a terminal's Ctrl-C already reaches them all). When a
// process exits non-zero or is killed, the others get SIGTERM and, after the
// grace period, SIGKILL; fulgor-run then exits with that process's status
// (128 + signal number when it was killed), after naming it on stderr.
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
  std::vector<std::string> command;
};

struct UsageError {
  std::string message;
};

const char* const kUsage =
    "usage: fulgor-run --nproc-per-node N [--nnodes M --node-rank R] [--master-addr A] [--master-port P]\n"
    "                  [--grace-period SECONDS] -- PROGRAM [ARGS...]\n";

long parse_number(const std::string& option, const std::string& value, long min, long max) {
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE || parsed < min || parsed > max)
    throw UsageError{
        fmt::format("{} '{}' is not accepted: expected a whole number from {} to {}", option, value, min, max)};
  return parsed;
}

Options parse(int argc, char** argv) {
  Options options;
  bool have_nproc = false;
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
    if (arg == "--nproc-per-node" || arg == "--nproc_per_node") {
      options.nproc_per_node = parse_number(arg, value, 1, 4096);
      have_nproc = true;
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
    } else {
      throw UsageError{fmt::format("unknown option '{}'", arg)};
    }
  }
  for (; i < argc; ++i) options.command.push_back(argv[i]);
  if (!have_nproc) throw UsageError{"--nproc-per-node is required"};
  if (options.command.empty()) throw UsageError{"no program given after '--'"};
  if (options.node_rank >= options.nnodes)
    throw UsageError{fmt::format("--node-rank {} is not accepted: expected 0 to {} for --nnodes {}", options.node_rank,
                                 options.nnodes - 1, options.nnodes)};
  if (options.nnodes > 1 && options.master_port == 0)
    throw UsageError{"--master-port is required with --nnodes > 1: every node must use the same port"};
  return options;
}

long free_port() {
  const int port = fulgor::detail::free_port();
  if (port < 0) throw std::runtime_error(fmt::format("cannot find a free port: {}", std::strerror(errno)));
  return port;
}

struct Child {
  long rank = 0;
  long local_rank = 0;
};

class Launcher {
 public:
  explicit Launcher(Options options) : options_(std::move(options)) {}

  int run() {
    const long port = options_.master_port != 0 ? options_.master_port : free_port();
    const long world_size = options_.nproc_per_node * options_.nnodes;

    // Signals are taken synchronously with sigtimedwait, so no handler races
    // with the bookkeeping; children get the original mask back before exec.
    sigset_t wanted, original;
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGCHLD);
    sigaddset(&wanted, SIGINT);
    sigaddset(&wanted, SIGTERM);
    sigprocmask(SIG_BLOCK, &wanted, &original);

    for (long local = 0; local < options_.nproc_per_node; ++local) {
      const long rank = options_.node_rank * options_.nproc_per_node + local;
      std::vector<std::string> env = child_environment(rank, local, world_size, port);
      std::vector<char*> envp, argv;
      for (std::string& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);
      for (std::string& a : options_.command) argv.push_back(a.data());
      argv.push_back(nullptr);
      const pid_t pid = fork();
      if (pid < 0) {
        std::cerr << fmt::format("fulgor-run: cannot start rank {}: {}\n", rank, std::strerror(errno));
        stop_all(SIGKILL);
        wait_for_all();
        return 1;
      }
      if (pid == 0) {
        sigprocmask(SIG_SETMASK, &original, nullptr);
        execvpe(argv[0], argv.data(), envp.data());
        const std::string message =
            fmt::format("fulgor-run: cannot run '{}' as rank {}: {}\n", argv[0], rank, std::strerror(errno));
        ssize_t ignored = write(STDERR_FILENO, message.data(), message.size());
        (void)ignored;
        _exit(127);
      }
      children_[pid] = Child{rank, local};
    }
    supervise();
    if (failed_) return failure_code_;
    if (received_signal_ != 0) return 128 + received_signal_;
    return 0;
  }

 private:
  std::vector<std::string> child_environment(long rank, long local, long world_size, long port) const {
    static const char* const ours[] = {"RANK",       "LOCAL_RANK",  "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"};
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
    env.push_back(fmt::format("WORLD_SIZE={}", world_size));
    env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", options_.nproc_per_node));
    env.push_back(fmt::format("GROUP_RANK={}", options_.node_rank));
    env.push_back(fmt::format("MASTER_ADDR={}", options_.master_addr));
    env.push_back(fmt::format("MASTER_PORT={}", port));
    if (options_.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) env.push_back("OMP_NUM_THREADS=1");
    return env;
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
    if (!stopping_) deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(options_.grace_seconds);
    stopping_ = true;
    stop_all(signal);
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
      failed_ = true;
      failure_code_ = fulgor::detail::exit_code_of(status);
      if (failure_code_ == 0) failure_code_ = 1;
      std::cerr << fmt::format("fulgor-run: rank {} (local rank {}, pid {}) {}; stopping the other {} rank{}\n",
                               child.rank, child.local_rank, pid, fulgor::detail::describe_wait_status(status),
                               children_.size(), children_.size() == 1 ? "" : "s");
      begin_stopping(SIGTERM);
    }
  }

  void supervise() {
    sigset_t wanted;
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGCHLD);
    sigaddset(&wanted, SIGINT);
    sigaddset(&wanted, SIGTERM);
    while (!children_.empty()) {
      reap();
      if (children_.empty()) break;
      timespec wait_for{1, 0};
      if (stopping_) {
        const auto left = deadline_ - std::chrono::steady_clock::now();
        if (left <= std::chrono::steady_clock::duration::zero()) {
          if (!killed_)
            std::cerr << fmt::format("fulgor-run: {} rank{} still running after the {} s grace period; killing\n",
                                     children_.size(), children_.size() == 1 ? "" : "s", options_.grace_seconds);
          killed_ = true;
          stop_all(SIGKILL);
        } else {
          const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
          wait_for = {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
        }
      }
      siginfo_t info{};
      const int signal = sigtimedwait(&wanted, &info, &wait_for);
      if (signal == SIGINT || signal == SIGTERM) {
        received_signal_ = signal;
        // A terminal's Ctrl-C (sent by the kernel) reached the whole
        // foreground process group, the ranks included; pass on only what was
        // sent to fulgor-run alone, so no rank gets it twice.
        if (info.si_code == SI_KERNEL) {
          if (!stopping_) deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(options_.grace_seconds);
          stopping_ = true;
        } else {
          begin_stopping(signal);
        }
      }
    }
  }

  Options options_;
  std::map<pid_t, Child> children_;
  bool stopping_ = false;
  bool killed_ = false;
  bool failed_ = false;
  int failure_code_ = 0;
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
