// A fit resumed from a checkpoint is the uninterrupted fit, at an epoch's end,
// mid-epoch, and after SIGTERM.

#include <csignal>
#include <thread>

#include "support/fitted.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

// Four epochs without stopping, for the resumed runs to match.
std::unique_ptr<TinyNet> straight_run(const TempDir& dir) {
  auto model = stateful_model();
  auto train = shuffled_loader(36, 8);
  auto val = sequential_loader(8, 4);
  torch::manual_seed(99);
  Trainer trainer(resumable(dir, 4));
  trainer.fit(*model, train, val);
  return model;
}

TEST(CheckpointResume, ResumeAfterTwoEpochsIsBitIdentical) {
  TempDir dir;
  auto straight = straight_run(dir);

  auto first = stateful_model();
  auto train = shuffled_loader(36, 8);
  auto val = sequential_loader(8, 4);
  torch::manual_seed(99);
  Trainer two(resumable(dir, 2));
  two.fit(*first, train, val);
  const std::string path = (dir.path / "two.ckpt").string();
  two.save_checkpoint(path);
  // Whatever happens to the generators in between must not matter.
  torch::manual_seed(12345);
  torch::randn({100});

  auto resumed = stateful_model();
  Trainer more(resumable(dir, 4));
  auto result = more.fit(*resumed, train, val, {.ckpt_path = path});
  EXPECT_TRUE(same_parameters(*resumed, *straight));
  EXPECT_EQ(resumed->training_steps, 2 * 5);
  EXPECT_EQ(result.epochs_completed, 4);
  EXPECT_EQ(more.global_step(), 20);

  auto meta = read_checkpoint_meta(path);
  EXPECT_EQ(meta.at("fulgor_version"), fulgor::version());
  EXPECT_EQ(meta.at("torch_version"), fulgor::torch_version());
  EXPECT_EQ(meta.at("loop").at("epoch"), 2);
  EXPECT_EQ(meta.at("loop").at("batches_in_epoch"), 0);
  EXPECT_EQ(meta.at("loop").at("global_step"), 10);
}

TEST(CheckpointResume, ResumeMidEpochWithAShuffledLoaderIsBitIdentical) {
  TempDir dir;
  auto straight = straight_run(dir);

  auto first = stateful_model();
  auto train = shuffled_loader(36, 8);
  auto val = sequential_loader(8, 4);
  // Saved where it stops, in the middle of the epoch: a checkpoint saved after
  // fit would resume at the next epoch, the stopped one counting as done.
  const std::string path = (dir.path / "mid.ckpt").string();
  auto stop = std::make_shared<Hooks>();
  stop->batch_end = [&](Trainer& t, int64_t) {
    if (t.current_epoch() != 1 || t.batches_in_epoch() != 3) return;
    t.save_checkpoint(path);
    t.request_stop("test stop");
  };
  auto options = resumable(dir, 4);
  options.callbacks = {stop};
  torch::manual_seed(99);
  Trainer partial(options);
  auto stopped = partial.fit(*first, train, val);
  EXPECT_EQ(stopped.reason, StopReason::requested);
  EXPECT_EQ(partial.global_step(), 8);
  EXPECT_EQ(read_checkpoint_meta(path).at("loop").at("batches_in_epoch"), 3);

  auto resumed = stateful_model();
  Trainer more(resumable(dir, 4));
  more.fit(*resumed, train, val, {.ckpt_path = path});
  EXPECT_EQ(resumed->training_steps, 20 - 8);
  EXPECT_TRUE(same_parameters(*resumed, *straight));
}

// A TensorLoader shuffles by epoch number. The resumed run makes a fresh one,
// as a new process would, which counts its epochs from 0 unless the Trainer
// tells it which epoch it plays.
TEST(CheckpointResume, ResumeMidEpochWithAShuffledTensorLoaderIsBitIdentical) {
  TempDir dir;
  const XY data(36, 7);
  auto make_loader = [&] { return TensorLoader(data.x, data.y, {.batch_size = 8, .shuffle = true, .seed = 5}); };
  auto val = sequential_loader(8, 4);

  auto straight = stateful_model();
  auto straight_train = make_loader();
  torch::manual_seed(99);
  Trainer uninterrupted(resumable(dir, 4));
  uninterrupted.fit(*straight, straight_train, val);

  auto first = stateful_model();
  auto train = make_loader();
  const std::string path = (dir.path / "mid.ckpt").string();
  auto stop = std::make_shared<Hooks>();
  stop->batch_end = [&](Trainer& t, int64_t) {
    if (t.current_epoch() != 2 || t.batches_in_epoch() != 2) return;
    t.save_checkpoint(path);
    t.request_stop("test stop");
  };
  auto options = resumable(dir, 4);
  options.callbacks = {stop};
  torch::manual_seed(99);
  Trainer partial(options);
  partial.fit(*first, train, val);
  ASSERT_EQ(partial.global_step(), 12);

  auto resumed = stateful_model();
  auto fresh_train = make_loader();
  Trainer more(resumable(dir, 4));
  more.fit(*resumed, fresh_train, val, {.ckpt_path = path});
  EXPECT_EQ(resumed->training_steps, 20 - 12);
  EXPECT_EQ(fresh_train.epoch(), 4);  // it played epochs 2 and 3
  EXPECT_TRUE(same_parameters(*resumed, *straight));
}

TEST(CheckpointResume, SigtermSavesAndResumes) {
  TempDir dir;
  auto straight = straight_run(dir);

  auto first = stateful_model();
  auto train = shuffled_loader(36, 8);
  auto val = sequential_loader(8, 4);
  auto raise_once = std::make_shared<Hooks>();
  raise_once->batch_end = [](Trainer& t, int64_t) {
    if (t.global_step() == 7) std::raise(SIGTERM);
  };
  auto options = resumable(dir, 4);
  options.callbacks = {raise_once};
  torch::manual_seed(99);
  Trainer interrupted(options);
  auto result = interrupted.fit(*first, train, val);
  EXPECT_EQ(result.reason, StopReason::signal);
  EXPECT_EQ(first->training_steps, 7);
  EXPECT_EQ(result.checkpoint_path, (dir.path / "checkpoints" / "last.ckpt").string());
  ASSERT_TRUE(fs::exists(result.checkpoint_path));

  // The handler is gone once fit returns.
  struct sigaction current {};
  ::sigaction(SIGTERM, nullptr, &current);
  EXPECT_EQ(current.sa_handler, SIG_DFL);

  auto resumed = stateful_model();
  Trainer more(resumable(dir, 4));
  more.fit(*resumed, train, val, {.ckpt_path = "last"});
  EXPECT_TRUE(same_parameters(*resumed, *straight));
}

}  // namespace
}  // namespace fulgor::testing
