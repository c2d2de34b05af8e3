// A second SIGINT or SIGTERM during fit ends the process at once (Note
// [Stopping on a signal] in src/loops/signals.h); the first is tested with the
// checkpoints it saves, in checkpoint_test.cpp.

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ostream>

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

struct SignalPair {
  int first, second;
};

std::string signal_name(int signal) { return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "other"; }

// For the test names ctest lists, instead of the bytes.
void PrintTo(const SignalPair& signals, std::ostream* out) {
  *out << signal_name(signals.first) << " then " << signal_name(signals.second);
}

void say(int fd, const std::string& text) {
  // Best effort: a lost note shows as a mismatch in the parent.
  [[maybe_unused]] const ssize_t written = ::write(fd, text.data(), text.size());
}

// Skips every batch: the child must not run autograd's backward, whose worker
// threads LibTorch refuses to use after a fork once the parent has used them
// (as it has when the tests before this one ran in the same process).
struct NoBackward : TinyNet {
  torch::Tensor training_step(torch::data::Example<>, int64_t) override {
    ++training_steps;
    return {};
  }
};

// In the child: a fit that receives `first` and then `second` at the end of its
// second batch, noting on `fd` what it got through. It never returns.
[[noreturn]] void fit_and_signal_twice(int fd, const TempDir& dir, SignalPair signals) {
  // A hang ends as SIGALRM, which the parent reports, instead of blocking the suite.
  ::alarm(60);
  NoBackward model;
  auto train = sequential_loader(16, 4);
  auto hooks = std::make_shared<Hooks>();
  hooks->batch_end = [&](Trainer&, int64_t batch_idx) {
    say(fd, "batch " + std::to_string(batch_idx) + "\n");
    if (batch_idx != 1) return;
    std::raise(signals.first);
    say(fd, "first signal\n");
    std::raise(signals.second);
    say(fd, "survived the second signal\n");
  };
  auto options = quiet(dir, 1, {hooks});
  options.enable_checkpointing = true;
  Trainer trainer(options);
  trainer.fit(model, train);
  say(fd, "fit returned\n");
  ::_exit(0);
}

class SecondSignal : public ::testing::TestWithParam<SignalPair> {};

TEST_P(SecondSignal, EndsTheProcessBeforeTheCheckpointAndReturn) {
  const SignalPair signals = GetParam();
  TempDir dir;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0) << std::strerror(errno);
  const pid_t child = ::fork();
  ASSERT_NE(child, -1) << std::strerror(errno);
  if (child == 0) {
    ::close(fds[0]);
    fit_and_signal_twice(fds[1], dir, signals);
  }
  ::close(fds[1]);
  std::string said;
  char buffer[256];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    ASSERT_GT(n, 0) << std::strerror(errno);
    said.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child) << std::strerror(errno);

  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with status " << WEXITSTATUS(status) << " after:\n" << said;
  EXPECT_EQ(WTERMSIG(status), signals.second) << "killed by signal " << WTERMSIG(status) << " after:\n" << said;
  // Nothing ran after the second signal: fit neither saved nor returned.
  EXPECT_EQ(said, "batch 0\nbatch 1\nfirst signal\n");
  EXPECT_FALSE(fs::exists(dir.path / "checkpoints" / "last.ckpt"));
}

INSTANTIATE_TEST_SUITE_P(Signals, SecondSignal,
                         ::testing::Values(SignalPair{SIGINT, SIGINT}, SignalPair{SIGTERM, SIGTERM},
                                           SignalPair{SIGINT, SIGTERM}, SignalPair{SIGTERM, SIGINT}),
                         [](const ::testing::TestParamInfo<SignalPair>& info) {
                           return signal_name(info.param.first) + "Then" + signal_name(info.param.second);
                         });

}  // namespace
}  // namespace fulgor::testing
