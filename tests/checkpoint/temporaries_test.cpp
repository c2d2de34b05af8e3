// Temporaries and orphaned checkpoints left by killed writers, removed by the
// next save into their folder.

#include <sys/file.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <random>
#include <regex>
#include <thread>

#include "../support/child_process.h"

#include "support/fitted.h"
#include "support/writer_model.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

std::set<std::string> temporaries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) names.insert(e.path().filename().string());
  return names;
}

TEST(CheckpointTemporaries, TheFirstSaveIntoAFolderRemovesStaleTemporariesButNotLiveOnes) {
  TempDir dir;
  auto model = stateful_model();
  const fs::path elsewhere = dir.path / "elsewhere" / "model.ckpt";
  fitted_one_epoch(dir, *model)->save_checkpoint(elsewhere.string());
  const std::string finished = file_bytes(elsewhere);
  const std::string zero_header(28, '\0');

  const fs::path folder = dir.path / "checkpoints";
  fs::create_directories(folder);
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(folder / name, std::ios::binary) << content;
  };
  // What writers killed mid-save leave: nothing written yet, the zeroed
  // header and part of the archive, or the whole file before the rename.
  const std::set<std::string> stale = {".last.ckpt.tmp.a1B2c3", ".epoch=0-step=2.ckpt.tmp.Zz9Yy8",
                                       ".model.ckpt.tmp.Q0q0Q0"};
  write(".last.ckpt.tmp.a1B2c3", "");
  write(".epoch=0-step=2.ckpt.tmp.Zz9Yy8", zero_header + finished.substr(28, 1000));
  write(".model.ckpt.tmp.Q0q0Q0", finished);
  // One another process is writing now: it holds the lock.
  write(".last.ckpt.tmp.L1ve00", zero_header);
  const int live = ::open((folder / ".last.ckpt.tmp.L1ve00").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(live, 0);
  ASSERT_EQ(::flock(live, LOCK_EX), 0);
  // Not fulgor's: other content, or a name of another shape.
  write(".notes.txt.tmp.abc123", "draft");
  write("last.ckpt.tmp.abc123", zero_header);
  write(".last.ckpt.tmp.abc12", zero_header);
  ASSERT_EQ(::mkfifo((folder / ".pipe.ckpt.tmp.f1f0f1").c_str(), 0644), 0);
  std::set<std::string> kept = {".last.ckpt.tmp.L1ve00", ".notes.txt.tmp.abc123", "last.ckpt.tmp.abc123",
                                ".last.ckpt.tmp.abc12", ".pipe.ckpt.tmp.f1f0f1"};

  auto fresh = stateful_model();
  auto options = resumable(dir, 1);
  options.enable_checkpointing = true;
  auto train = sequential_loader(16, 8);
  Trainer trainer(options);
  trainer.fit(*fresh, train);
  EXPECT_EQ(temporaries(folder), kept);
  EXPECT_TRUE(fs::exists(folder / "epoch=0-step=2.ckpt"));

  // Its first save into another folder clears that one too.
  const fs::path manual = dir.path / "manual";
  fs::create_directories(manual);
  std::ofstream(manual / ".x.ckpt.tmp.a1B2c3", std::ios::binary) << zero_header;
  trainer.save_checkpoint((manual / "x.ckpt").string());
  EXPECT_TRUE(temporaries(manual).empty());
  ::close(live);
}

// Two processes saving into one folder: each one's sweep must spare the
// other's temporaries while they are written. flock locks belong to open
// files, so a thread sweeping stands in for the other process.
TEST(CheckpointTemporaries, SavesSurviveSweepsOfTheirFolderRunningAlongside) {
  TempDir dir;
  const std::string folder = (dir.path / "shared").string();
  fs::create_directories(folder);
  std::atomic<bool> done{false};
  std::atomic<int64_t> sweeps{0};
  std::thread sweeper([&] {
    for (; !done; ++sweeps) detail::remove_stale_temporaries(folder);
  });
  std::vector<std::string> errors;
  for (int i = 0; i < 100; ++i) {
    // At least one sweep between two saves, however the threads are scheduled.
    for (const int64_t before = sweeps; sweeps == before;) std::this_thread::yield();
    torch::serialize::OutputArchive archive;
    archive.write("x", torch::full({64 * 1024}, static_cast<float>(i)));
    try {
      write_checkpoint_file(folder + "/shared.ckpt", archive);
    } catch (const CheckpointError& e) {
      errors.push_back(e.what());
    }
  }
  done = true;
  sweeper.join();
  EXPECT_TRUE(errors.empty()) << errors.size() << " saves failed, the first: " << errors.front();
  EXPECT_GE(sweeps.load(), 100);
  auto archive = read_checkpoint_file(folder + "/shared.ckpt");
  torch::Tensor x;
  archive.read("x", x);
  EXPECT_EQ(x[0].item<float>(), 99.0f);
  EXPECT_TRUE(temporaries(folder).empty());
}

// The .ckpt files in `folder` that the ModelCheckpoint state in its
// last.ckpt does not name (Note [Orphaned checkpoint files]).
std::vector<std::string> unnamed_checkpoints(const fs::path& folder) {
  std::set<std::string> named;
  const nlohmann::json meta = read_checkpoint_meta((folder / "last.ckpt").string());
  for (const auto& [key, state] : meta.at("callbacks").items()) {
    if (key.rfind("ModelCheckpoint", 0) != 0) continue;
    named.insert(state.at("last_model_path").get<std::string>());
    named.insert(state.at("best_model_path").get<std::string>());
    for (const auto& item : state.at("best_k_models").items()) named.insert(item.key());
  }
  std::vector<std::string> unnamed;
  for (const auto& e : fs::directory_iterator(folder))
    if (e.path().extension() == ".ckpt" && !named.count(e.path().string())) unnamed.push_back(e.path().string());
  return unnamed;
}

// A process saving after every step (keeping the best three), killed with
// SIGKILL at random moments, over and over: every checkpoint it leaves loads,
// each run resumes from "last" where the previous one got to, and the next
// run removes the temporaries the killed ones left and the checkpoints no
// state names (a kill between a top-k save and last.ckpt's).
TEST(CheckpointTemporaries, AWriterKilledAtRandomMomentsLeavesLoadableCheckpoints) {
  TempDir dir;
  const fs::path folder = dir.path / "checkpoints";
  const std::string log = (dir.path / "writer.log").string();
  // Each run starts LibTorch afresh, about a second, several on a machine
  // busy building. Runs are killed 30 times, or for two minutes when they
  // start that slowly (and at least 5 times), within the suite's time limit.
  const auto kill_until = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("kill delays drawn with seed " + std::to_string(seed));
  std::mt19937 random(seed);
  std::uniform_int_distribution<int> delay_ms(0, 300);
  const std::regex started("training from step (\\d+)");
  // The step a run resumed from, once it has begun training; a minute bounds a stuck run.
  auto start_step = [&](fulgor::test::Child& writer) -> std::optional<int64_t> {
    std::smatch m;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    for (std::string out; writer.running() && std::chrono::steady_clock::now() < deadline;
         std::this_thread::sleep_for(std::chrono::milliseconds(5)))
      if (out = writer.log(); std::regex_search(out, m, started)) return std::stoll(m[1].str());
    return std::nullopt;
  };

  int64_t previous_start = 0;
  size_t temporaries_left = 0, orphans_left = 0;
  int kills = 0;
  for (; kills < 30 && (kills < 5 || std::chrono::steady_clock::now() < kill_until); ++kills) {
    fulgor::test::Child writer({FULGOR_CHECKPOINT_WRITER, dir.str(), "1000000000"}, {}, log);
    const auto start = start_step(writer);
    ASSERT_TRUE(start.has_value()) << "run " << kills << " did not begin training in time:\n" << writer.log();
    EXPECT_GE(*start, previous_start) << "run " << kills;
    previous_start = *start;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(random)));
    writer.signal(SIGKILL);
    const auto status = writer.wait(std::chrono::seconds(10));
    ASSERT_TRUE(status && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL)
        << "run " << kills << " ended by itself:\n"
        << writer.log();
    if (fs::exists(folder)) temporaries_left += temporaries(folder).size();
    if (fs::exists(folder / "last.ckpt")) orphans_left += unnamed_checkpoints(folder).size();
  }
  std::cout << kills << " kills left " << temporaries_left << " temporaries and " << orphans_left
            << " unnamed checkpoints, each removed by the next run\n";

  size_t loaded = 0;
  for (const auto& e : fs::directory_iterator(folder)) {
    if (e.path().extension() != ".ckpt") continue;
    WriterModel model;
    EXPECT_NO_THROW(load_module_weights(model, e.path().string())) << e.path();
    ++loaded;
  }
  EXPECT_GE(loaded, 1u);
  ASSERT_TRUE(fs::exists(folder / "last.ckpt"));
  const int64_t reached = read_checkpoint_meta((folder / "last.ckpt").string()).at("loop").at("global_step");
  EXPECT_GE(reached, previous_start);
  // As a kill leaves it, should the last kill have left none.
  std::ofstream(folder / ".last.ckpt.tmp.K1lled", std::ios::binary) << std::string(28, '\0') << "partial";

  fulgor::test::Child last({FULGOR_CHECKPOINT_WRITER, dir.str(), std::to_string(reached + 3)}, {}, log);
  EXPECT_EQ(start_step(last).value_or(-1), reached);
  ASSERT_TRUE(fulgor::test::exited_with(last.wait(std::chrono::minutes(1)), 0)) << last.log();
  EXPECT_EQ(read_checkpoint_meta((folder / "last.ckpt").string()).at("loop").at("global_step"), reached + 3);
  EXPECT_TRUE(temporaries(folder).empty());
  EXPECT_EQ(unnamed_checkpoints(folder), std::vector<std::string>{});
}

}  // namespace
}  // namespace fulgor::testing
