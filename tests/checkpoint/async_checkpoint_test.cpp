// Asynchronous saves (Note [Asynchronous checkpoints] in
// src/checkpoint/background_writer.h): the file a synchronous save writes, a
// signal or a kill with a write in flight, a failed write, and the files a
// ModelCheckpoint displaces removed only once the new one is on disk.

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>

#include "../support/child_process.h"
#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

// Large enough (a 12 MB checkpoint with Adam's state) that a write takes
// milliseconds after the save has returned.
struct WideNet : fulgor::Module {
  torch::nn::Linear wide{nullptr}, out{nullptr};
  torch::nn::Dropout drop{nullptr};
  WideNet() {
    wide = register_module("wide", torch::nn::Linear(4, 1024));
    out = register_module("out", torch::nn::Linear(1024, 1024));
    drop = register_module("drop", torch::nn::Dropout(0.2));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    auto y = out(drop(torch::tanh(wide(batch.data)))).mean(1, true);
    auto loss = torch::mse_loss(y, batch.target);
    log("train_loss", loss);
    return loss;
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01));
  }
};

std::unique_ptr<WideNet> wide_net() {
  torch::manual_seed(11);
  return std::make_unique<WideNet>();
}

std::string async_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<std::string> async_temporaries(const fs::path& folder) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->path().filename().string().find(".tmp.") != std::string::npos) found.push_back(it->path().string());
  return found;
}

TrainerOptions async_options(const TempDir& dir, int64_t max_steps, bool async,
                             std::vector<std::shared_ptr<Callback>> callbacks) {
  auto o = quiet(dir, -1, std::move(callbacks));
  o.max_steps = max_steps;
  o.async_checkpointing = async;
  o.enable_checkpointing = true;
  return o;
}

std::shared_ptr<ModelCheckpoint> every_step_saves(int64_t every, int64_t top_k = -1, bool last = false) {
  return std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{
      .filename = "{step}", .save_top_k = top_k, .save_last = last, .every_n_train_steps = every});
}

// A fit saving asynchronously trains as one saving synchronously, and a
// resume from either's checkpoint is bit-identical to the run that went on.
TEST(AsyncCheckpoint, AResumeFromAnAsynchronousSaveIsAsExactAsFromASynchronousOne) {
  TempDir sync_dir, async_dir;
  auto train = shuffled_loader(64, 8);
  auto sync_model = wide_net();
  Trainer(async_options(sync_dir, 10, false, {every_step_saves(3)})).fit(*sync_model, train);
  auto async_model = wide_net();
  Trainer(async_options(async_dir, 10, true, {every_step_saves(3)})).fit(*async_model, train);
  EXPECT_TRUE(same_parameters(*sync_model, *async_model));
  for (const TempDir* dir : {&sync_dir, &async_dir}) {
    SCOPED_TRACE(dir == &sync_dir ? "from the synchronous save" : "from the asynchronous save");
    TempDir resume_dir;
    auto resumed = wide_net();
    const std::string from = (dir->path / "checkpoints" / "step=3.ckpt").string();
    Trainer(async_options(resume_dir, 10, true, {})).fit(*resumed, train, {.ckpt_path = from});
    EXPECT_TRUE(same_parameters(*sync_model, *resumed));
  }
}

// The snapshot holds copies with the live tensors' dtypes, shapes, strides
// and flags: the file written from it is byte for byte the synchronous one.
TEST(AsyncCheckpoint, AnAsynchronousSaveWritesTheBytesOfASynchronousOne) {
  TempDir dir;
  auto train = shuffled_loader(32, 8);
  auto model = wide_net();
  Trainer trainer(async_options(dir, 3, true, {}));
  trainer.fit(*model, train);
  trainer.save_checkpoint((dir.path / "sync.ckpt").string());
  // The second snapshot reuses the first's memory (Note [Reusing snapshot memory]).
  for (const char* name : {"async.ckpt", "again.ckpt"}) {
    trainer.save_checkpoint_async((dir.path / name).string());
    trainer.wait_for_checkpoint();
  }
  const std::string sync = async_bytes(dir.path / "sync.ckpt");
  EXPECT_GT(sync.size(), 12u << 20);
  EXPECT_TRUE(async_bytes(dir.path / "async.ckpt") == sync);
  EXPECT_TRUE(async_bytes(dir.path / "again.ckpt") == sync);
}

// A callback that raises SIGTERM right after the ModelCheckpoint before it
// started the save of `step`, and records whether that write was still in
// flight.
struct TermDuringWrite : Callback {
  int64_t step;
  fs::path file;
  bool in_flight = false;
  TermDuringWrite(int64_t at, fs::path written) : step(at), file(std::move(written)) {}
  bool saves_checkpoints() const override { return true; }  // after the ModelCheckpoint
  void on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor&, int64_t) override {
    if (trainer.global_step() != step) return;
    in_flight = !fs::exists(file);
    std::raise(SIGTERM);
  }
};

// SIGTERM with a write in flight: the write completes before fit returns,
// and a resume from it is bit-identical to an uninterrupted run.
TEST(AsyncCheckpoint, ASignalWithAWriteInFlightCompletesItAndTheResumeIsExact) {
  TempDir dir;
  const fs::path folder = dir.path / "checkpoints";
  auto train = shuffled_loader(64, 8);
  auto uninterrupted = wide_net();
  Trainer(async_options(dir, 8, false, {})).fit(*uninterrupted, train);

  auto stopped = wide_net();
  auto term = std::make_shared<TermDuringWrite>(4, folder / "step=4.ckpt");
  const FitResult result = Trainer(async_options(dir, 8, true, {every_step_saves(2), term})).fit(*stopped, train);
  EXPECT_EQ(result.reason, StopReason::signal);
  EXPECT_TRUE(term->in_flight) << "the write had completed before the signal";
  EXPECT_EQ(read_checkpoint_meta((folder / "step=4.ckpt").string()).at("loop").at("global_step"), 4);
  EXPECT_TRUE(fs::exists(folder / "last.ckpt"));
  EXPECT_EQ(async_temporaries(folder), std::vector<std::string>{});

  auto resumed = wide_net();
  Trainer(async_options(dir, 8, true, {})).fit(*resumed, train, {.ckpt_path = (folder / "step=4.ckpt").string()});
  EXPECT_TRUE(same_parameters(*uninterrupted, *resumed));
}

// Watches the folder after each of the ModelCheckpoint's saves and before
// each batch: once a checkpoint is complete, one always is, and the file a
// save displaces stays while the new one is written.
struct WatchDisplacement : Callback {
  fs::path folder;
  std::vector<std::string> problems;
  int64_t kept_displaced = 0;
  bool seen_complete = false;
  explicit WatchDisplacement(fs::path f) : folder(std::move(f)) {}
  bool saves_checkpoints() const override { return true; }  // after the ModelCheckpoint
  void on_train_batch_start(Trainer& trainer, ModuleBase&, int64_t) override { check(trainer.global_step()); }
  void on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor&, int64_t) override {
    const int64_t step = trainer.global_step();
    if (step >= 2 && fs::exists(folder / fmt::format("step={}.ckpt", step - 1))) ++kept_displaced;
    check(step);
  }
  void check(int64_t step) {
    bool complete = false;
    std::error_code ec;
    for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (it->path().extension() != ".ckpt") continue;
      try {
        read_checkpoint_meta(it->path().string());
        complete = true;
      } catch (const Error&) {
      }
    }
    if (seen_complete && !complete) problems.push_back(fmt::format("step {}: no complete checkpoint", step));
    seen_complete = seen_complete || complete;
  }
};

// Note [Removing displaced files]: with save_top_k=1 each save displaces the
// previous file, which goes only once the new one is on disk.
TEST(AsyncCheckpoint, ADisplacedFileIsRemovedOnlyOnceTheNewOneIsOnDisk) {
  TempDir dir;
  const fs::path folder = dir.path / "checkpoints";
  auto train = sequential_loader(64, 8);
  auto watch = std::make_shared<WatchDisplacement>(folder);
  auto model = wide_net();
  Trainer(async_options(dir, 6, true, {every_step_saves(1, 1), watch})).fit(*model, train);
  EXPECT_EQ(watch->problems, std::vector<std::string>{});
  EXPECT_EQ(watch->kept_displaced, 5);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, std::set<std::string>{"step=6.ckpt"});
}

// One write is in flight at most: last.ckpt, saved right after each top-k
// file, waits for its write, and the profiler counts the wait.
TEST(AsyncCheckpoint, TheWaitForTheWriteInFlightIsAProfilerAction) {
  TempDir dir;
  auto train = sequential_loader(32, 8);
  auto model = adam_step_lr_net(5, 0.0);
  auto options = async_options(dir, 4, true, {every_step_saves(1, 1, true)});
  options.profiler = "simple";
  options.profiler_dirpath = dir.str();
  options.profiler_filename = "profile";
  Trainer trainer(options);
  trainer.fit(*model, train);
  const auto* waited = trainer.profiler()->find("wait_for_checkpoint_write");
  ASSERT_NE(waited, nullptr);
  EXPECT_GE(waited->calls, 4);
  const auto* saved = trainer.profiler()->find("save_checkpoint");
  ASSERT_NE(saved, nullptr);
  EXPECT_EQ(saved->calls, 8);
}

// A failed background write surfaces as a CheckpointError naming the file at
// the next step, and the fit ends there.
TEST(AsyncCheckpoint, AFailedBackgroundWriteIsACheckpointErrorAtTheNextStep) {
  TempDir dir;
  const fs::path folder = dir.path / "checkpoints";
  fs::create_directories(folder / "last.ckpt");  // a folder where last.ckpt goes
  auto train = sequential_loader(64, 8);
  int64_t steps = 0;
  auto count = std::make_shared<Hooks>();
  count->batch_end = [&](Trainer& t, int64_t) { steps = t.global_step(); };
  auto model = wide_net();
  try {
    Trainer(async_options(dir, 8, true, {every_step_saves(1, -1, true), count})).fit(*model, train);
    ADD_FAILURE() << "no CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((folder / "last.ckpt").string()), std::string::npos) << what;
    EXPECT_NE(what.find("not a regular file"), std::string::npos) << what;
  }
  EXPECT_LE(steps, 2);
  EXPECT_TRUE(fs::is_directory(folder / "last.ckpt"));
  EXPECT_EQ(async_temporaries(folder), std::vector<std::string>{});
}

// A full disk in the background (a file-size limit, in a child process) is a
// CheckpointError with the system's reason where the Trainer waits for the
// write, the temporary removed.
TEST(AsyncCheckpoint, AFullDiskInTheBackgroundIsACheckpointErrorWithTheSystemsReason) {
  TempDir dir;
  // Small tensors, copied without LibTorch's thread pool, which a forked
  // child must not use.
  auto model = adam_step_lr_net(5, 0.0);
  auto train = sequential_loader(16, 8);
  Trainer trainer(async_options(dir, 2, true, {}));
  trainer.fit(*model, train);
  const fs::path path = dir.path / "full" / "last.ckpt";
  const fs::path report = dir.path / "report.txt";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limited{1024, RLIM_INFINITY};
    ::setrlimit(RLIMIT_FSIZE, &limited);
    std::string problem = "no CheckpointError";
    trainer.save_checkpoint_async(path.string());
    try {
      trainer.wait_for_checkpoint();
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      problem = what.find(path.string()) != std::string::npos && what.find(std::strerror(EFBIG)) != std::string::npos
                    ? ""
                    : what;
    }
    const rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
    ::setrlimit(RLIMIT_FSIZE, &unlimited);
    if (problem.empty() && !async_temporaries(path.parent_path()).empty()) problem = "a temporary was left";
    std::ofstream(report) << problem;
    ::_exit(problem.empty() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the saving process died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << async_bytes(report);
}

// kill -9 with the write of last.ckpt in flight: the previous last.ckpt
// loads, and the next run resumes from it and leaves no temporary. The writer
// kills itself once it sees the write's temporary, but the write goes on
// until the kill lands and may complete in between (more often on a busy
// machine): then last.ckpt is the one of the kill's step. Either way it loads
// and names the step it must. The kill is repeated, each run resuming, until
// one leaves the write's temporary; should none, one is put there as a kill
// leaves it, so that the next run's removal is checked all the same.
TEST(AsyncCheckpoint, AKillDuringABackgroundWriteLeavesThePreviousFileAndTheNextRunNoTemporary) {
  TempDir dir;
  const fs::path folder = dir.path / "checkpoints";
  const std::regex killed_at("killed at step (\\d+)");
  int64_t reached = 0;
  bool left_temporary = false;
  for (int kill = 0; kill < 5 && !left_temporary; ++kill) {
    SCOPED_TRACE("kill " + std::to_string(kill));
    const std::string log = (dir.path / fmt::format("killed-{}.log", kill)).string();
    fulgor::test::Child killed(
        {FULGOR_CHECKPOINT_WRITER, dir.str(), "1000", std::to_string(std::max<int64_t>(3, reached + 1))}, {}, log);
    const auto status = killed.wait(std::chrono::seconds(60));
    ASSERT_TRUE(status && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << killed.log();
    const std::string out = killed.log();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, killed_at)) << out;
    const int64_t step = std::stoll(m[1].str());
    left_temporary = !async_temporaries(folder).empty();
    reached = read_checkpoint_meta((folder / "last.ckpt").string()).at("loop").at("global_step");
    // One write is in flight at most: the previous last.ckpt is the step's before.
    EXPECT_EQ(reached, left_temporary ? step - 1 : step) << (left_temporary ? "write in flight" : "write completed");
  }
  if (!left_temporary) {
    std::cout << "5 kills, each after its write had completed: a temporary put there\n";
    std::ofstream(folder / ".last.ckpt.tmp.K1lled", std::ios::binary) << std::string(28, '\0') << "partial";
  }

  const std::string log = (dir.path / "next.log").string();
  fulgor::test::Child next({FULGOR_CHECKPOINT_WRITER, dir.str(), std::to_string(reached + 2)}, {}, log);
  ASSERT_TRUE(fulgor::test::exited_with(next.wait(std::chrono::seconds(60)), 0)) << next.log();
  EXPECT_NE(next.log().find(fmt::format("training from step {}\n", reached)), std::string::npos) << next.log();
  EXPECT_EQ(read_checkpoint_meta((folder / "last.ckpt").string()).at("loop").at("global_step"), reached + 2);
  EXPECT_EQ(async_temporaries(folder), std::vector<std::string>{});
}

}  // namespace
}  // namespace fulgor::testing
