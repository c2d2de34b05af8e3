// The program the fault-injection test (fault_injection_test.cpp) starts as
// both ranks of a job through fulgor-run --max-restarts, killing them at
// random:
//
//   fulgor_fault_worker OUTDIR EPOCHS
//
// Each start first appends "RESTART_COUNT RANK PID" to OUTDIR/pids, so the
// test knows whom to kill and can check that none is left. Then it fits
// FaultNet (fault_scenario.h) EPOCHS epochs with ckpt_path "last", saving after every step
// into OUTDIR/checkpoints, so that a kill lands in a checkpoint write as
// often as in a step or a collective. After the fit it writes
// OUTDIR/result_rankR.pt (a temporary renamed, so a kill never leaves a
// partial one) and waits until OUTDIR/release exists: the job cannot end
// before the test has injected all its faults, and some land after a fit
// that had finished. With FULGOR_FAULT_TEST_PID set, it ends (status 1) when
// that process has gone, at its start or while it waits, so that a test
// killed by its timeout leaves no job behind. Exits 0 on success, 1 when the fit was stopped by a
// signal (fulgor-run's SIGTERM after the other rank died), 3 with the message
// on a fulgor::Error, 4 on any other exception.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include "fault_scenario.h"
#include "fulgor/core/error.h"
#include "fulgor/distributed/environment.h"
#include "worker_main.h"

namespace {

void record_start(const std::string& out, int64_t rank) {
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const std::string line =
      std::string(restart ? restart : "0") + " " + std::to_string(rank) + " " + std::to_string(getpid()) + "\n";
  // One write to a file opened for appending: the ranks' lines never mix.
  const int fd = open((out + "/pids").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    throw std::runtime_error("cannot append to " + out + "/pids");
  close(fd);
}

// Whether the test that started the job has gone (FULGOR_FAULT_TEST_PID).
bool test_gone() {
  const char* pid = std::getenv("FULGOR_FAULT_TEST_PID");
  return pid != nullptr && kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fulgor::test;
  int64_t rank = 0;
  return fulgor::test::run_worker(rank, [&] {
    if (argc != 3) {
      std::cerr << "usage: fulgor_fault_worker OUTDIR EPOCHS\n";
      return 2;
    }
    const std::string out = argv[1];
    const auto env = fulgor::detect_distributed_environment();
    rank = env.rank;
    record_start(out, rank);
    if (test_gone()) return 1;
    torch::set_num_threads(1);
    FaultNet model(init_seed(rank));
    auto loader = make_fault_loader(env.world_size, env.rank);
    fulgor::Trainer trainer(fault_options(out, std::stoll(argv[2])));
    const fulgor::FitResult fit = trainer.fit(model, loader, fulgor::FitOptions{"last"});
    if (fit.reason == fulgor::StopReason::signal) return 1;
    const std::string result = fault_result_path(out, rank);
    write_fault_result(result + ".partial", trainer, fit, model);
    std::filesystem::rename(result + ".partial", result);
    while (!std::filesystem::exists(out + "/release")) {
      if (test_gone()) return 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  });
}
