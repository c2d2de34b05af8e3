// ckpt_path = "last" (Note [Resolving "last"]), as Lightning resolves it.

#include <chrono>

#include "support/fitted.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kNoLastCheckpoint =
    "ckpt_path=\"last\") is set, but there is no last checkpoint available. No checkpoint will be loaded. HINT: Set "
    "`ModelCheckpoint(..., save_last=True)`.";

// Saves, to `path`, a fresh model fitted `epochs` epochs of two steps.
void save_after_epochs(const TempDir& dir, int64_t epochs, const fs::path& path) {
  auto model = stateful_model();
  auto train = sequential_loader(16, 8);
  Trainer trainer(resumable(dir, epochs));
  trainer.fit(*model, train);
  trainer.save_checkpoint(path.string());
}

// Makes `path` look modified `minutes` ago: the order of saves a test means,
// which the file system's coarse clock may not tell apart.
void modified_minutes_ago(const fs::path& path, int minutes) {
  fs::last_write_time(path, fs::file_time_type::clock::now() - std::chrono::minutes(minutes));
}

// The step a fit of 5 epochs (10 steps) from "last" resumed at.
int64_t step_resumed_from_last(const TempDir& dir, std::vector<std::shared_ptr<Callback>> callbacks = {}) {
  auto model = stateful_model();
  auto train = sequential_loader(16, 8);
  auto options = resumable(dir, 5);
  options.callbacks = std::move(callbacks);
  Trainer trainer(options);
  trainer.fit(*model, train, {.ckpt_path = "last"});
  EXPECT_EQ(trainer.global_step(), 10);
  return 10 - model->training_steps;
}

// As in Lightning, "last" with no checkpoint is no error, so that a job can
// pass it at its first start as well as at its restarts: a warning, and the
// stage begins from the module as it is.
TEST(LastCheckpoint, LastWithoutACheckpointWarnsAndTrainsFromScratch) {
  TempDir dir;
  auto train = sequential_loader(16, 8);
  auto fresh = stateful_model();
  torch::manual_seed(5);
  Trainer(resumable(dir, 2)).fit(*fresh, train);

  auto model = stateful_model();
  torch::manual_seed(5);
  Trainer trainer(resumable(dir, 2));
  ::testing::internal::CaptureStderr();
  trainer.fit(*model, train, {.ckpt_path = "last"});
  std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find(std::string(".fit(") + kNoLastCheckpoint), std::string::npos) << said;
  EXPECT_EQ(model->training_steps, 4);
  EXPECT_EQ(trainer.global_step(), 4);
  EXPECT_TRUE(same_parameters(*model, *fresh));

  ::testing::internal::CaptureStderr();
  trainer.validate(*model, train, {.ckpt_path = "last"});
  said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find(std::string(".validate(") + kNoLastCheckpoint), std::string::npos) << said;
  EXPECT_TRUE(same_parameters(*model, *fresh));
}

// Lightning's rule: the most recently modified of the folder's last*.ckpt
// and OnExceptionCheckpoint's file, whatever their names or steps; another
// checkpoint only when there is none of those.
TEST(LastCheckpoint, LastIsTheMostRecentlyModifiedLastCheckpoint) {
  TempDir dir;
  const fs::path folder = dir.path / "checkpoints", exceptions = dir.path / "exceptions";
  save_after_epochs(dir, 1, folder / "last.ckpt");
  save_after_epochs(dir, 2, folder / "last-v1.ckpt");
  save_after_epochs(dir, 3, exceptions / "on_exception.ckpt");
  save_after_epochs(dir, 4, folder / "epoch=3-step=8.ckpt");
  modified_minutes_ago(folder / "last.ckpt", 20);
  modified_minutes_ago(folder / "last-v1.ckpt", 10);
  EXPECT_EQ(step_resumed_from_last(dir), 4);

  modified_minutes_ago(folder / "last.ckpt", 5);
  EXPECT_EQ(step_resumed_from_last(dir), 2);

  // The file of an OnExceptionCheckpoint the Trainer has, which a fit that
  // ends well removes.
  modified_minutes_ago(exceptions / "on_exception.ckpt", 1);
  EXPECT_EQ(step_resumed_from_last(dir, {std::make_shared<OnExceptionCheckpoint>(exceptions.string())}), 6);
  EXPECT_FALSE(fs::exists(exceptions / "on_exception.ckpt"));

  fs::remove(folder / "last.ckpt");
  fs::remove(folder / "last-v1.ckpt");
  EXPECT_EQ(step_resumed_from_last(dir), 8);
}

// A save killed mid-write leaves its temporary (Note [Temporary checkpoint
// files]), newer than any complete file; "last" never takes one.
TEST(LastCheckpoint, LastNeverChoosesTheTemporaryOfAnInterruptedSave) {
  TempDir dir;
  const fs::path folder = dir.path / "checkpoints";
  save_after_epochs(dir, 1, folder / "last.ckpt");
  save_after_epochs(dir, 2, folder / "step=4.ckpt");
  const std::string whole = file_bytes(folder / "step=4.ckpt");
  // As killed saves leave them: the header still zeros and the records cut
  // short, or the whole file before the rename.
  std::ofstream(folder / ".last.ckpt.tmp.K1lled", std::ios::binary)
      << std::string(28, '\0') << whole.substr(28, whole.size() / 2);
  std::ofstream(folder / ".step=6.ckpt.tmp.Zz9Yy8", std::ios::binary) << whole;
  modified_minutes_ago(folder / "last.ckpt", 20);
  modified_minutes_ago(folder / "step=4.ckpt", 10);
  EXPECT_EQ(step_resumed_from_last(dir), 2);

  fs::remove(folder / "last.ckpt");
  EXPECT_EQ(step_resumed_from_last(dir), 4);
  EXPECT_TRUE(fs::exists(folder / ".last.ckpt.tmp.K1lled"));
}

}  // namespace
}  // namespace fulgor::testing
