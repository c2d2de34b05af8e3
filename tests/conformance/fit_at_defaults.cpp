// The check fit_at_defaults: what a user's program does with no options but
// the accelerator, run in a process of its own.

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "checks.h"

extern char** environ;

namespace fulgor::conformance {
namespace {

// Generous: the fit is a few seconds; a job that hangs must still end.
constexpr auto kLimit = std::chrono::minutes(5);

struct Finished {
  int status = 0;
  std::string output;
};

Finished run_again(std::vector<std::string> command) {
  char pattern[] = "/tmp/fulgor-conformance-XXXXXX";
  const int fd = mkstemp(pattern);
  if (fd < 0) fail("cannot make a temporary file for the program's output");
  unlink(pattern);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fd, STDERR_FILENO);
  std::vector<char*> argv;
  for (auto& argument : command) argv.push_back(argument.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    close(fd);
    fail(fmt::format("cannot run this program again: {}", std::strerror(error)));
  }
  Finished finished;
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  while (waitpid(pid, &finished.status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);  // its ranks die with it
      waitpid(pid, &finished.status, 0);
      close(fd);
      fail("the fit did not end within 5 minutes");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string output(static_cast<size_t>(lseek(fd, 0, SEEK_END)), '\0');
  if (pread(fd, output.data(), output.size(), 0) < 0) output.clear();
  close(fd);
  finished.output = output;
  return finished;
}

}  // namespace

std::string check_fit_at_defaults(const Accelerator& accelerator, const std::vector<std::string>& command) {
  std::vector<std::string> again = command;
  again.push_back("--fit-at-defaults");
  const Finished finished = run_again(again);
  const std::string& out = finished.output;
  if (!WIFEXITED(finished.status) || WEXITSTATUS(finished.status) != 0)
    fail(fmt::format("a Trainer at its defaults failed (wait status {}): {}", finished.status,
                     out.substr(out.rfind('\n', out.size() - 2) + 1)));
  std::istringstream lines(out);
  std::string report;
  int reports = 0;
  for (std::string l; std::getline(lines, l);)
    if (l.rfind("fit_at_defaults ", 0) == 0) ++reports, report = l;
  if (reports != 1) fail(fmt::format("{} ranks reported the fit, expected rank 0 alone: {}", reports, out));
  int64_t world_size = 0, steps = 0;
  double loss = 0;
  if (std::sscanf(report.c_str(), "fit_at_defaults world_size %ld steps %ld last_loss %lf", &world_size, &steps,
                  &loss) != 3)
    fail("unreadable report: " + report);
  const auto selected = static_cast<int64_t>(accelerator.parse_devices(Devices("auto")).size());
  if (world_size != selected)
    fail(fmt::format("the fit ran {} process(es), but devices=auto selects {} device(s)", world_size, selected));
  if (steps != steps_at_defaults(world_size))
    fail(fmt::format("rank 0 took {} steps, expected {}", steps, steps_at_defaults(world_size)));
  if (!std::isfinite(loss)) fail(fmt::format("the last loss is {}", loss));
  return fmt::format("{} process{}, strategy auto", world_size, world_size == 1 ? "" : "es, one a device");
}

}  // namespace fulgor::conformance
