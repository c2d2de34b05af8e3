// A checkpoint file: written atomically, refused cleanly when broken or
// malformed, naming what is wrong, and never a path that is not a regular file.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <future>

#include "support/fitted.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointFile, BrokenFilesFailCleanlyAndChangeNothing) {
  TempDir dir;
  auto model = stateful_model();
  auto train = sequential_loader(16, 8);
  const fs::path good = dir.path / "good.ckpt";
  fitted_one_epoch(dir, *model)->save_checkpoint(good.string());
  const std::string bytes = file_bytes(good);
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir.path / name, std::ios::binary) << content;
    return (dir.path / name).string();
  };
  std::string corrupted = bytes;
  corrupted[corrupted.size() / 2] ^= 0x5a;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {write("corrupted.ckpt", corrupted), "corrupted"},
      {write("truncated.ckpt", bytes.substr(0, bytes.size() / 3)), "truncated"},
      {write("foreign.ckpt", "name,value\nloss,0.5\n"), "not a fulgor checkpoint"},
      {(dir.path / "missing.ckpt").string(), "cannot be opened: No such file"}};
  const auto before = listing(dir.path);
  for (const auto& [path, what] : cases) {
    auto fresh = stateful_model();
    auto options = resumable(dir, 2);
    options.logger = true;
    options.enable_checkpointing = true;
    Trainer resumed(options);
    try {
      resumed.fit(*fresh, train, {.ckpt_path = path});
      ADD_FAILURE() << "no error for " << path;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(fresh->training_steps, 0);
  }
  EXPECT_EQ(listing(dir.path), before);
}

// One parser reads a checkpoint's metadata, for resuming and for
// read_checkpoint_meta alike, and names the entry it cannot use.
TEST(CheckpointFile, MalformedMetadataIsNamedByEveryReader) {
  TempDir dir;
  auto model = stateful_model();
  const fs::path good = dir.path / "good.ckpt";
  fitted_one_epoch(dir, *model)->save_checkpoint(good.string());
  const nlohmann::json meta = read_checkpoint_meta(good.string());
  auto with_meta = [&](const std::string& name, const nlohmann::json& changed) {
    torch::serialize::OutputArchive archive;
    archive.write("meta", c10::IValue(changed.dump()));
    const std::string path = (dir.path / name).string();
    write_checkpoint_file(path, archive);
    return path;
  };
  nlohmann::json no_step = meta, text_epoch = meta, newer = meta, foreign = meta;
  no_step["loop"].erase("global_step");
  text_epoch["loop"]["epoch"] = "one";
  newer["format_version"] = 99;
  foreign["format"] = "something-else";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {with_meta("no_step.ckpt", no_step), "'loop.global_step' is missing"},
      {with_meta("text_epoch.ckpt", text_epoch), "'loop.epoch' is \"one\", expected an integer"},
      {with_meta("newer.ckpt", newer), "format version 99"},
      {with_meta("foreign.ckpt", foreign), "not a fulgor training checkpoint"}};
  auto train = sequential_loader(16, 8);
  for (const auto& [path, what] : cases) {
    auto fresh = stateful_model();
    Trainer resumed(resumable(dir, 2));
    for (const std::string& message :
         {test::thrown_message<CheckpointError>([&] { resumed.fit(*fresh, train, {.ckpt_path = path}); }),
          test::thrown_message<CheckpointError>([&] { read_checkpoint_meta(path); })}) {
      EXPECT_NE(message.find(path), std::string::npos) << message;
      EXPECT_NE(message.find(what), std::string::npos) << message;
    }
    EXPECT_EQ(fresh->training_steps, 0);
  }
}

TEST(CheckpointFile, SavesAreAtomicAndLeaveNoTemporaryFiles) {
  TempDir dir;
  auto model = stateful_model();
  auto train = sequential_loader(16, 8);
  Trainer trainer(resumable(dir, 1));
  trainer.fit(*model, train);
  const fs::path path = dir.path / "a" / "model.ckpt";
  trainer.save_checkpoint(path.string());
  const auto first = fs::file_size(path);
  trainer.save_checkpoint(path.string());  // replaces
  EXPECT_EQ(fs::file_size(path), first);
  EXPECT_EQ(std::distance(fs::directory_iterator(path.parent_path()), fs::directory_iterator()), 1);
  // A save that cannot complete leaves the previous file as it was.
  fs::create_directories(dir.path / "b" / "model.ckpt" / "occupied");
  EXPECT_THROW(trainer.save_checkpoint((dir.path / "b" / "model.ckpt").string()), CheckpointError);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path / "b"), fs::directory_iterator()), 1);

  auto copy = stateful_model();
  load_module_weights(*copy, path.string());
  EXPECT_TRUE(same_parameters(*copy, *model));
}

// A disk that fills up during a save: the write fails part-way (here the file
// size limit stands in for the full disk), the error names the file and the
// reason, and the previous checkpoint is untouched.
TEST(CheckpointFile, AWriteFailingPartWayLeavesThePreviousFile) {
  TempDir dir;
  auto model = stateful_model();
  auto trainer = fitted_one_epoch(dir, *model);
  const fs::path path = dir.path / "model.ckpt";
  trainer->save_checkpoint(path.string());
  const std::string before = file_bytes(path);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // so an oversized write fails with EFBIG
  rlimit limited = saved;
  limited.rlim_cur = static_cast<rlim_t>(before.size() / 2);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string error;
  try {
    trainer->save_checkpoint(path.string());
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  EXPECT_NE(error.find("write failed"), std::string::npos) << error;
  EXPECT_EQ(file_bytes(path), before);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.insert(e.path().filename().string());
  for (const auto& name : names) EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
}

// ---- Paths that are not regular files ---------------------------------------

TEST(CheckpointFile, APathThatIsNotARegularFileIsAnErrorNamingIt) {
  TempDir dir;
  auto model = stateful_model();
  auto trainer = fitted_one_epoch(dir, *model);
  const std::string fifo = (dir.path / "fifo.ckpt").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  auto expect_refused = [&](const std::function<void()>& use, const std::string& path) {
    try {
      use();
      ADD_FAILURE() << "no error for " << path;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  };
  // Opening a FIFO for reading waits for a writer: run it aside, and be the
  // writer if it is still waiting, so that a failure ends.
  auto reading = std::async(std::launch::async, [&] {
    expect_refused([&] { read_checkpoint_meta(fifo); }, fifo);
    // fit(ckpt_path) tells the format from the file's first bytes, on the descriptor it then reads.
    auto fresh = stateful_model();
    auto train = sequential_loader(16, 8);
    Trainer resumed(resumable(dir, 2));
    const std::string message =
        test::thrown_message<CheckpointError>([&] { resumed.fit(*fresh, train, {.ckpt_path = fifo}); });
    EXPECT_NE(message.find("checkpoint '" + fifo + "' is a FIFO, not a regular file"), std::string::npos) << message;
    EXPECT_EQ(fresh->training_steps, 0);
  });
  if (reading.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "reading the FIFO " << fifo << " waits for a writer";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  reading.get();
  // Saving would replace it.
  expect_refused([&] { trainer->save_checkpoint(fifo); }, fifo);
  EXPECT_TRUE(fs::is_fifo(fifo));

  const std::string folder = (dir.path / "folder.ckpt").string();
  fs::create_directories(folder);
  expect_refused([&] { read_checkpoint_meta(folder); }, folder);
  expect_refused([&] { trainer->save_checkpoint(folder); }, folder);
}

// Metadata nested past the limit of the JSON reader is refused, where it once
// could overflow the stack.
TEST(CheckpointFile, MetadataNestedTooDeeplyIsRefused) {
  TempDir dir;
  const std::string path = (dir.path / "deep.ckpt").string();
  const int depth = 100000;
  torch::serialize::OutputArchive archive;
  archive.write("meta", c10::IValue("{\"format\": \"fulgor-checkpoint\", \"format_version\": 1, \"module\": " +
                                    std::string(depth, '[') + std::string(depth, ']') + "}"));
  write_checkpoint_file(path, archive);
  try {
    read_checkpoint_meta(path);
    ADD_FAILURE() << "accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nested deeper than"), std::string::npos) << e.what();
  }
  TinyNet model;
  Trainer trainer(quiet(dir, 1));
  auto train = sequential_loader(8, 4);
  try {
    trainer.fit(model, train, {.ckpt_path = path});
    ADD_FAILURE() << "accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than"), std::string::npos) << e.what();
  }
}

// Metadata of another shape is a CheckpointError naming what is wrong, where
// the JSON library's errors escaped and a negative epoch was resumed from.
TEST(CheckpointFile, MalformedMetadataIsRefusedNamingWhatIsWrong) {
  struct Rewrite : Callback {
    std::function<void(nlohmann::json&)> change;
    void on_save_checkpoint(Trainer&, ModuleBase&, nlohmann::json& checkpoint) override { change(checkpoint); }
  };
  using Change = std::function<void(nlohmann::json&)>;
  const std::string early_stopping = "EarlyStopping{monitor=train_loss,mode=min}";
  const std::vector<std::pair<Change, std::string>> cases = {
      {[](nlohmann::json& m) { m["loop"]["epoch"] = -3; }, "'loop.epoch' is -3"},
      {[](nlohmann::json& m) { m["loop"]["global_step"] = "two"; }, "'loop.global_step' is \"two\""},
      {[](nlohmann::json& m) { m.erase("loop"); }, "'loop' is missing"},
      {[](nlohmann::json& m) { m["optimizers"] = -1; }, "'optimizers' is -1"},
      {[](nlohmann::json& m) { m["accelerator"] = 5; }, "'accelerator' is 5"},
      {[&](nlohmann::json& m) { m["callbacks"][early_stopping]["wait_count"] = "x"; },
       "the state of " + early_stopping},
      {[](nlohmann::json& m) {
         m["schedulers"] = nlohmann::json::array({{{"last_epoch", 1}}});
       },
       "scheduler 0"},
      // A step more would overflow.
      {[](nlohmann::json& m) { m["schedulers"][0]["last_epoch"] = INT64_MAX; },
       "scheduler state 'last_epoch' is 9223372036854775807"},
  };
  TempDir dir;
  const std::string path = (dir.path / "rewritten.ckpt").string();
  auto train = sequential_loader(8, 4);
  auto watch_loss = [] { return std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "train_loss"}); };
  for (const auto& [change, what] : cases) {
    TinyNet model;
    model.make_optimizers = [](TinyNet& m) {
      auto sgd = std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
      return OptimizerConfig(sgd, {.scheduler = std::make_shared<StepLR>(*sgd, 1, 0.5)});
    };
    auto rewrite = std::make_shared<Rewrite>();
    rewrite->change = change;
    Trainer writer(quiet(dir, 1, {watch_loss(), rewrite}));
    writer.fit(model, train);
    writer.save_checkpoint(path);
    TinyNet fresh;
    fresh.make_optimizers = model.make_optimizers;
    Trainer reader(quiet(dir, 2, {watch_loss()}));
    try {
      reader.fit(fresh, train, {.ckpt_path = path});
      ADD_FAILURE() << what << ": accepted";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fulgor::testing
