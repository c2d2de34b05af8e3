#pragma once

// Starting, bounding and cleaning up child processes in tests.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace fulgor::test {

/// A fresh directory, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fulgor-ddp-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// A TCP port nothing listens on now (the kernel's choice for port 0).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw std::runtime_error("cannot find a free port");
  close(fd);
  return ntohs(address.sin_port);
}

/// A child process that is killed and reaped when the object goes away, so a
/// failing test leaves nothing running.
class Child {
 public:
  /// Runs argv[0] with the test's environment minus any launcher variables,
  /// plus `extra`; stdout and stderr go to `log` (both).
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra, const std::string& log)
      : log_(log) {
    static const char* const launcher_prefixes[] = {"RANK=",       "LOCAL_RANK=",  "WORLD_SIZE=",  "LOCAL_WORLD_SIZE=",
                                                    "GROUP_RANK=", "MASTER_ADDR=", "MASTER_PORT=", "SLURM_"};
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      bool drop = false;
      for (const char* prefix : launcher_prefixes) drop = drop || entry.rfind(prefix, 0) == 0;
      if (!drop) env.push_back(entry);
    }
    // Two cores shared by the ranks: one thread each.
    env.push_back("OMP_NUM_THREADS=1");
    for (const auto& [name, value] : extra) env.push_back(name + "=" + value);
    std::vector<std::string> args = argv;
    std::vector<char*> envp, argp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    for (std::string& a : args) argp.push_back(a.data());
    argp.push_back(nullptr);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + log);
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // A process group of its own, so that the child's own children (the
      // ranks fulgor-run starts) can be killed with it.
      setpgid(0, 0);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execve(argp[0], argp.data(), envp.data());
      _exit(127);
    }
    close(fd);
  }
  ~Child() {
    if (pid_ <= 0) return;
    kill(-pid_, SIGKILL);
    if (!status_) {
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const { kill(pid_, sig); }

  /// The wait status once the child ended, or nullopt if it was still running
  /// after `limit` (then it is killed and reaped).
  std::optional<int> wait(std::chrono::seconds limit) {
    if (status_) return status_;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) return status_ = status;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(-pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    status_ = status;
    return std::nullopt;
  }

  std::string log() const { return read_text(log_); }

 private:
  std::string log_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

inline bool exited_with(const std::optional<int>& status, int code) {
  return status && WIFEXITED(*status) && WEXITSTATUS(*status) == code;
}

/// Runs `fulgor-run --nproc-per-node 2 -- worker args...` and returns its
/// wait status (nullopt when it overran `limit`) and its output.
inline std::pair<std::optional<int>, std::string> run_two_ranks(
    const std::string& worker, const std::vector<std::string>& worker_args, const std::string& log,
    std::chrono::seconds limit = std::chrono::seconds(120)) {
  std::vector<std::string> argv = {FULGOR_RUN_PATH, "--nproc-per-node", "2", "--", worker};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  Child launcher(argv, {}, log);
  std::optional<int> status = launcher.wait(limit);
  return {status, launcher.log()};
}

/// The same with the distributed layer's worker.
inline std::pair<std::optional<int>, std::string> run_two_ranks(
    const std::vector<std::string>& worker_args, const std::string& log,
    std::chrono::seconds limit = std::chrono::seconds(120)) {
  return run_two_ranks(FULGOR_DISTRIBUTED_WORKER, worker_args, log, limit);
}

/// Starts `argv` as ranks 0 and 1 of a job on loopback without fulgor-run
/// (which would stop a survivor itself, and mixes the ranks' output); rank N
/// writes to dir/logN.
inline std::vector<std::unique_ptr<Child>> start_two_ranks(const std::vector<std::string>& argv,
                                                           const std::string& dir) {
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Child>> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.push_back(std::make_unique<Child>(argv,
                                            std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                                                               {"LOCAL_RANK", std::to_string(rank)},
                                                                               {"WORLD_SIZE", "2"},
                                                                               {"MASTER_ADDR", "127.0.0.1"},
                                                                               {"MASTER_PORT", port}},
                                            (std::filesystem::path(dir) / ("log" + std::to_string(rank))).string()));
  return ranks;
}

}  // namespace fulgor::test
