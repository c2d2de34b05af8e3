// Checkpoints: exact resume, atomic files, clean failures, signals.

#include <sys/resource.h>

#include <csignal>
#include <fstream>

#include "tiny.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

// Dropout, Adam and a scheduler: state everywhere a resume could lose it.
std::unique_ptr<TinyNet> stateful_model() {
  torch::manual_seed(21);
  auto model = std::make_unique<TinyNet>(0.3);
  model->make_optimizers = [](TinyNet& m) {
    auto adam = std::make_shared<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(0.01));
    return fulgor::OptimizerConfig(adam, {.scheduler = std::make_shared<StepLR>(*adam, 1, 0.7)});
  };
  return model;
}

TrainerOptions resumable(const TempDir& dir, int64_t epochs) {
  auto o = quiet(dir.str());
  o.max_epochs = epochs;
  o.num_sanity_val_steps = 1;
  return o;
}

// A Trainer that has fitted `model` for an epoch, to save checkpoints of it.
std::unique_ptr<Trainer> fitted_one_epoch(const TempDir& dir, TinyNet& model) {
  auto train = sequential_loader(16, 8);
  auto trainer = std::make_unique<Trainer>(resumable(dir, 1));
  trainer->fit(model, train);
  return trainer;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(dir)) names.insert(e.path().string());
  return names;
}

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

TEST(Checkpoint, ResumeAfterTwoEpochsIsBitIdentical) {
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

TEST(Checkpoint, ResumeMidEpochWithAShuffledLoaderIsBitIdentical) {
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
TEST(Checkpoint, ResumeMidEpochWithAShuffledTensorLoaderIsBitIdentical) {
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

TEST(Checkpoint, SigtermSavesAndResumes) {
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

TEST(Checkpoint, BrokenFilesFailCleanlyAndChangeNothing) {
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
      {(dir.path / "missing.ckpt").string(), "cannot read"}};
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

TEST(Checkpoint, SavesAreAtomicAndLeaveNoTemporaryFiles) {
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

TEST(Checkpoint, ModelCheckpointLastAndEveryNSteps) {
  TempDir dir;
  auto model = stateful_model();
  auto train = sequential_loader(32, 8);  // 4 steps per epoch
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.filename = "{step}", .save_top_k = -1, .save_last = true, .every_n_train_steps = 3});
  auto options = resumable(dir, 2);
  options.callbacks = {checkpoint};
  Trainer trainer(options);
  trainer.fit(*model, train);
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.path / "checkpoints")) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"step=3.ckpt", "step=6.ckpt", "last.ckpt"}));
  EXPECT_EQ(read_checkpoint_meta((dir.path / "checkpoints" / "last.ckpt").string()).at("loop").at("global_step"), 6);
}

// A disk that fills up during a save: the write fails part-way (here the file
// size limit stands in for the full disk), the error names the file and the
// reason, and the previous checkpoint is untouched.
TEST(Checkpoint, AWriteFailingPartWayLeavesThePreviousFile) {
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

// Metadata nested past the limit of the JSON reader is refused, where it once
// could overflow the stack.
TEST(Checkpoint, MetadataNestedTooDeeplyIsRefused) {
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
TEST(Checkpoint, MalformedMetadataIsRefusedNamingWhatIsWrong) {
  struct Rewrite : Callback {
    std::function<void(nlohmann::json&)> change;
    void on_save_checkpoint(Trainer&, ModuleBase&, nlohmann::json& checkpoint) override { change(checkpoint); }
  };
  using Change = std::function<void(nlohmann::json&)>;
  const std::string early_stopping = "EarlyStopping{monitor=train_loss,mode=min}";
  const std::vector<std::pair<Change, std::string>> cases = {
      {[](nlohmann::json& m) { m["loop"]["epoch"] = -3; }, "loop.epoch is -3"},
      {[](nlohmann::json& m) { m["loop"]["global_step"] = "two"; }, "loop.global_step is \"two\""},
      {[](nlohmann::json& m) { m.erase("loop"); }, "loop is missing"},
      {[](nlohmann::json& m) { m["optimizers"] = -1; }, "optimizers is -1"},
      {[](nlohmann::json& m) { m["accelerator"] = 5; }, "accelerator is 5"},
      {[&](nlohmann::json& m) { m["callbacks"][early_stopping]["wait_count"] = "x"; },
       "the state of " + early_stopping},
      {[](nlohmann::json& m) {
         m["schedulers"] = nlohmann::json::array({{{"last_epoch", 1}}});
       },
       "scheduler 0"},
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
