// Checkpoints a resume cannot honour, and a disk that fills up mid-save.

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <set>

#include "../support/thrown.h"
#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

// Adam and a scheduler, so that a resume restores optimizer state.
std::unique_ptr<TinyNet> faults_model() { return adam_step_lr_net(5, 0.2); }

std::string faults_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A float64 checkpoint resumed into a float32 module was cast silently, and
// Adam's float64 state then failed inside LibTorch in the first step.
TEST(CheckpointFaults, ADtypeMismatchIsRefusedNamingTheParameterAndBothDtypes) {
  TempDir dir;
  auto model = faults_model();
  auto train = sequential_loader(16, 8);
  Trainer trainer(quiet(dir, 1));
  trainer.fit(*model, train);
  model->to(torch::kFloat64);
  const std::string path = (dir.path / "double.ckpt").string();
  trainer.save_checkpoint(path);

  auto single = faults_model();
  Trainer resumed(quiet(dir, 2));
  std::string m = test::thrown_message<CheckpointError>([&] { resumed.fit(*single, train, {.ckpt_path = path}); });
  EXPECT_NE(m.find(path), std::string::npos) << m;
  EXPECT_NE(m.find("'l1.weight' is Double, the module's is Float"), std::string::npos) << m;
  EXPECT_EQ(single->training_steps, 0);
  m = test::thrown_message<CheckpointError>([&] { load_module_weights(*single, path); });
  EXPECT_NE(m.find("'l1.weight' is Double, the module's is Float"), std::string::npos) << m;
  // The module converted to the checkpoint's dtype loads it.
  auto twin = faults_model();
  twin->to(torch::kFloat64);
  load_module_weights(*twin, path);
  EXPECT_TRUE(torch::equal(twin->l2->weight, model->l2->weight));
}

// A checkpoint like the Trainer's, without the generator states.
void write_without_rng_states(Trainer& trainer, TinyNet& model, const std::string& from, const std::string& to) {
  torch::serialize::OutputArchive archive;
  archive.write("meta", c10::IValue(read_checkpoint_meta(from).dump()));
  torch::serialize::OutputArchive weights;
  model.save(weights);
  archive.write("model", weights);
  torch::serialize::OutputArchive optimizer;
  trainer.optimizers().at(0)->save(optimizer);
  archive.write("optimizer_0", optimizer);
  write_checkpoint_file(to, archive);
}

TEST(CheckpointFaults, AMissingGeneratorStateIsNamedAndRefusedUnderDeterministic) {
  TempDir dir;
  auto model = faults_model();
  auto train = shuffled_loader(16, 8);
  Trainer trainer(quiet(dir, 1));
  trainer.fit(*model, train);
  const std::string full = (dir.path / "full.ckpt").string(), bare = (dir.path / "bare.ckpt").string();
  trainer.save_checkpoint(full);
  write_without_rng_states(trainer, *model, full, bare);

  // With every state there is nothing to say.
  auto quiet_resume = faults_model();
  Trainer complete(quiet(dir, 2));
  ::testing::internal::CaptureStderr();
  complete.fit(*quiet_resume, train, {.ckpt_path = full});
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("generator state"), std::string::npos);

  auto warned = faults_model();
  Trainer resumed(quiet(dir, 2));
  ::testing::internal::CaptureStderr();
  resumed.fit(*warned, train, {.ckpt_path = bare});
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("checkpoint '" + bare + "' holds no generator state 'rng_cpu'"), std::string::npos) << said;
  EXPECT_EQ(warned->training_steps, 2);

  auto refused = faults_model();
  auto options = quiet(dir, 2);
  options.deterministic = true;
  Trainer strict(options);
  const std::string m =
      test::thrown_message<CheckpointError>([&] { strict.fit(*refused, train, {.ckpt_path = bare}); });
  EXPECT_NE(m.find("'rng_cpu'"), std::string::npos) << m;
  EXPECT_NE(m.find("deterministic=true"), std::string::npos) << m;
  EXPECT_EQ(refused->training_steps, 0);
}

// Saves `path` again under file-size limits that cut the write at every
// region of the file (the header, the records, the zip's end); each must be
// a CheckpointError naming the file and the system's reason, the previous
// file intact and no temporary left. Returns what went wrong, "" if nothing.
std::string save_under_size_limits(Trainer& trainer, const fs::path& path) {
  const std::string before = faults_bytes(path);
  const std::string reason = std::strerror(EFBIG);
  std::vector<rlim_t> limits;
  for (size_t at = 0; at < before.size(); at += before.size() / 40 + 1) limits.push_back(at);
  for (size_t back = 1; back <= 64 && back < before.size(); ++back) limits.push_back(before.size() - back);
  std::signal(SIGXFSZ, SIG_IGN);  // so that an oversized write fails with EFBIG
  for (const rlim_t limit : limits) {
    const rlimit limited{limit, RLIM_INFINITY};
    if (::setrlimit(RLIMIT_FSIZE, &limited) != 0) return "setrlimit failed";
    const std::string m = test::thrown_message<CheckpointError>([&] { trainer.save_checkpoint(path.string()); });
    const rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
    ::setrlimit(RLIMIT_FSIZE, &unlimited);
    if (m.find(path.string()) == std::string::npos || m.find(reason) == std::string::npos)
      return "limit " + std::to_string(limit) + ": " + m;
    if (faults_bytes(path) != before) return "limit " + std::to_string(limit) + ": the previous file changed";
    for (const auto& e : fs::directory_iterator(path.parent_path()))
      if (e.path() != path) return "limit " + std::to_string(limit) + ": left " + e.path().string();
  }
  return "";
}

// A full disk once made PyTorchStreamWriter's destructor throw: SIGABRT, the
// temporary left behind. The limits are set in a child process, which
// reports through its exit status and a file.
TEST(CheckpointFaults, AFullDiskIsACheckpointErrorAtWhateverByteTheWriteFails) {
  TempDir dir;
  auto model = faults_model();
  auto train = sequential_loader(16, 8);
  Trainer trainer(quiet(dir, 1));
  trainer.fit(*model, train);
  const fs::path path = dir.path / "ckpts" / "last.ckpt";
  trainer.save_checkpoint(path.string());
  const fs::path report = dir.path / "report.txt";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string problem = save_under_size_limits(trainer, path);
    std::ofstream(report) << problem;
    ::_exit(problem.empty() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the saving process died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << faults_bytes(report);
}

// Note [Orphaned checkpoint files]: a kill between a top-k save and the next
// last.ckpt leaves a file that the resumed state does not name. The resume
// removes it, and nothing that is not such a file.
TEST(CheckpointFaults, AResumeRemovesTheCheckpointsItsStateForgotAndNoOtherFile) {
  TempDir dir;
  auto options_until = [&](int64_t steps) {
    auto o = quiet(dir, -1);
    o.max_steps = steps;
    o.enable_checkpointing = true;
    o.callbacks = {std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions{.filename = "{step}", .save_top_k = 1, .save_last = true, .every_n_train_steps = 1})};
    return o;
  };
  auto train = sequential_loader(64, 8);
  const fs::path folder = dir.path / "checkpoints";
  auto model = faults_model();
  Trainer first(options_until(2));
  first.fit(*model, train);
  first.save_checkpoint((folder / "manual.ckpt").string());
  const std::string stale_last = faults_bytes(folder / "last.ckpt");
  Trainer(options_until(4)).fit(*model, train, {.ckpt_path = "last"});
  ASSERT_TRUE(fs::exists(folder / "step=4.ckpt"));
  ASSERT_FALSE(fs::exists(folder / "step=2.ckpt"));
  // As if killed after writing step=4.ckpt and before the last.ckpt naming it.
  std::ofstream(folder / "last.ckpt", std::ios::binary | std::ios::trunc) << stale_last;
  // Files that are not the callback's to remove: a user's, a copy of one of
  // its files, and the Trainer's own save (manual.ckpt).
  std::ofstream(folder / "notes.ckpt") << "mine";
  fs::copy_file(folder / "step=4.ckpt", folder / "copy.ckpt");

  auto resumed = faults_model();
  Trainer(options_until(3)).fit(*resumed, train, {.ckpt_path = "last"});
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"step=3.ckpt", "last.ckpt", "notes.ckpt", "copy.ckpt", "manual.ckpt"}));
}

}  // namespace
}  // namespace fulgor::testing
