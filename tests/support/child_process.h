#pragma once

// Starting, bounding and cleaning up child processes in tests.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
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

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
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

  /// Whether the child is still running; one that has ended is reaped.
  bool running() {
    if (status_) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return true;
    status_ = status;
    return false;
  }

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

}  // namespace fulgor::test
