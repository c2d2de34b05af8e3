// Checkpoints: exact resume, atomic files, clean failures, signals, the
// container format, temporaries left by killed writers.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <future>
#include <random>
#include <regex>
#include <thread>

#include "../support/child_process.h"
#include "../support/thrown.h"
#include "support/writer_model.h"
#include "tiny.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

// Dropout, Adam and a scheduler: state everywhere a resume could lose it.
std::unique_ptr<TinyNet> stateful_model() { return adam_step_lr_net(21, 0.3); }

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
TEST(Checkpoint, MalformedMetadataIsNamedByEveryReader) {
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

// ---- Paths that are not regular files ---------------------------------------

TEST(Checkpoint, APathThatIsNotARegularFileIsAnErrorNamingIt) {
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

// ---- The container -----------------------------------------------------------

std::string shell_output(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return out;
  char chunk[256];
  for (size_t n; (n = std::fread(chunk, 1, sizeof(chunk), pipe)) > 0;) out.append(chunk, n);
  ::pclose(pipe);
  return out;
}

std::string hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

uint64_t le64(const std::string& bytes, size_t at) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i) value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return value;
}

void put_le(std::string& bytes, size_t at, uint64_t value, size_t size) {
  for (size_t i = 0; i < size; ++i) bytes[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

constexpr uint64_t kChunk = 262144;  // Note [Checked chunks]

// A stateful model with a 1.2 MB buffer: a checkpoint of several chunks.
std::unique_ptr<TinyNet> wide_model() {
  auto model = stateful_model();
  model->register_buffer("ballast", torch::randn({300000}));
  return model;
}

std::vector<std::string> xxh3_digests(const std::string& printed) {
  std::vector<std::string> digests;
  const std::regex digest("[0-9a-f]{16}");
  for (auto it = std::sregex_iterator(printed.begin(), printed.end(), digest); it != std::sregex_iterator(); ++it)
    digests.push_back(it->str());
  return digests;
}

// docs/training.md's recipe: xxhsum prints each chunk's hash as the list at
// the end of the file holds it, and the list's hash as bytes 20..27 hold it.
TEST(Checkpoint, XxhsumChecksTheStoredHashes) {
  if (std::system("command -v xxhsum >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "xxhsum is not installed (Debian package xxhash), so the recipe cannot be run";
  TempDir dir;
  auto model = wide_model();
  const fs::path path = dir.path / "model.ckpt";
  fitted_one_epoch(dir, *model)->save_checkpoint(path.string());
  const std::string bytes = file_bytes(path);
  ASSERT_GT(bytes.size(), 28u);
  EXPECT_EQ(bytes.substr(0, 12), std::string("FULGORCK\x04\0\0\0", 12));
  const uint64_t length = le64(bytes, 12), chunks = (length + kChunk - 1) / kChunk;
  EXPECT_GE(chunks, 4u);
  ASSERT_EQ(bytes.size(), 28 + length + 8 * chunks);

  const std::string file = "'" + path.string() + "'";
  const std::string stored = shell_output("od -An -tx1 -j20 -N8 " + file + " | tr -d ' \\n'");
  EXPECT_EQ(stored, hex(bytes.substr(20, 8)));
  const std::string n = shell_output("od -An -tu8 -j12 -N8 " + file + " | tr -d ' \\n'");
  EXPECT_EQ(n, std::to_string(length));
  const auto list = xxh3_digests(
      shell_output(fmt::format("tail -c $((8 * (({} + 262143) / 262144))) {} | xxhsum -H3 --little-endian", n, file)));
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0], stored);
  const auto each = xxh3_digests(shell_output(
      fmt::format("tail -c +29 {} | head -c {} | split -b 262144 --filter='xxhsum -H3 --little-endian'", file, n)));
  ASSERT_EQ(each.size(), chunks);
  for (uint64_t i = 0; i < chunks; ++i) EXPECT_EQ(each[i], hex(bytes.substr(28 + length + 8 * i, 8))) << i;
}

// A changed byte anywhere, in the chunks LibTorch reads first or last, in the
// partial last chunk, in the list of hashes or in the header's hash, is named
// as corruption, and the module is left as it was.
TEST(Checkpoint, EveryChunkIsChecked) {
  TempDir dir;
  auto model = wide_model();
  const fs::path good = dir.path / "good.ckpt";
  fitted_one_epoch(dir, *model)->save_checkpoint(good.string());
  const std::string bytes = file_bytes(good);
  const uint64_t length = le64(bytes, 12);
  ASSERT_GT(length, 3 * kChunk);
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir.path / name, std::ios::binary) << content;
    return (dir.path / name).string();
  };
  const std::vector<uint64_t> offsets = {
      21, 28 + 40, 28 + kChunk + 7, 28 + 2 * kChunk + 100, 28 + length - 5, 28 + length + 3, bytes.size() - 1};
  auto untouched = wide_model();
  for (const uint64_t at : offsets) {
    std::string broken = bytes;
    broken[at] ^= 0x20;
    const std::string path = write(fmt::format("broken_{}.ckpt", at), broken);
    auto target = wide_model();
    try {
      load_module_weights(*target, path);
      ADD_FAILURE() << "a changed byte at " << at << " went unnoticed";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("is corrupted: its contents do not match its checksum"), std::string::npos)
          << at << ": " << e.what();
    }
    EXPECT_TRUE(same_parameters(*target, *untouched)) << at;
    EXPECT_TRUE(target->named_buffers()["ballast"].equal(untouched->named_buffers()["ballast"])) << at;
  }
  auto refused = [&](const std::string& name, const std::string& content, const std::string& what) {
    try {
      read_checkpoint_file(write(name, content));
      ADD_FAILURE() << name << " was read";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused("no_list.ckpt", bytes.substr(0, 28 + length),
          fmt::format("truncated: {} of {} bytes present", length, bytes.size() - 28));
  refused("trailing.ckpt", bytes + "abc", "corrupted: 3 bytes past the end of its data");
  auto copy = wide_model();
  load_module_weights(*copy, good.string());
  EXPECT_TRUE(same_parameters(*copy, *model));
  EXPECT_TRUE(copy->named_buffers()["ballast"].equal(model->named_buffers()["ballast"]));
}

// Version 2's hash, from its definition: FNV-1a over the archive's
// little-endian 64-bit words, the last zero-padded.
uint64_t version2_hash(std::string archive) {
  archive.resize((archive.size() + 7) / 8 * 8, '\0');
  uint64_t hash = 1469598103934665603ULL;
  for (size_t at = 0; at < archive.size(); at += 8) {
    hash ^= le64(archive, at);
    hash *= 1099511628211ULL;
  }
  return hash;
}

// Version 3's hash, XXH3-64 of the whole archive, by xxhsum.
uint64_t version3_hash(const fs::path& dir, const std::string& archive) {
  std::ofstream(dir / "archive", std::ios::binary) << archive;
  const auto digests = xxh3_digests(shell_output("xxhsum -H3 --little-endian '" + (dir / "archive").string() + "'"));
  EXPECT_EQ(digests.size(), 1u);
  uint64_t hash = 0;
  for (int i = 0; i < 8 && !digests.empty(); ++i)
    hash |= std::stoull(digests[0].substr(2 * i, 2), nullptr, 16) << (8 * i);
  return hash;
}

// Files of earlier fulgor versions: one hash over the archive, no list.
TEST(Checkpoint, ReadsVersion2And3Files) {
  if (std::system("command -v xxhsum >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "xxhsum is not installed (Debian package xxhash), so a version 3 file cannot be made";
  TempDir dir;
  auto model = stateful_model();
  auto train = sequential_loader(16, 8);
  const fs::path current = dir.path / "current.ckpt";
  fitted_one_epoch(dir, *model)->save_checkpoint(current.string());
  const std::string bytes = file_bytes(current);
  const std::string archive = bytes.substr(28, le64(bytes, 12));
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir.path / name, std::ios::binary) << content;
    return (dir.path / name).string();
  };
  auto older = [&](uint32_t version, uint64_t hash) {
    std::string file = bytes.substr(0, 28) + archive;
    put_le(file, 8, version, 4);
    put_le(file, 20, hash, 8);
    return file;
  };
  const std::string v3 = older(3, version3_hash(dir.path, archive));
  for (const auto& [name, content] :
       {std::pair{std::string("v2.ckpt"), older(2, version2_hash(archive))}, std::pair{std::string("v3.ckpt"), v3}}) {
    const std::string old = write(name, content);
    auto copy = stateful_model();
    load_module_weights(*copy, old);
    EXPECT_TRUE(same_parameters(*copy, *model)) << name;
    auto resumed = stateful_model();
    Trainer more(resumable(dir, 2));
    more.fit(*resumed, train, {.ckpt_path = old});
    EXPECT_EQ(resumed->training_steps, 2) << name;
    EXPECT_EQ(more.global_step(), 4) << name;
  }

  // The version decides the hash: version 2 with version 3's hash is corrupted.
  std::string mixed = v3;
  put_le(mixed, 8, 2, 4);
  EXPECT_THROW(
      {
        try {
          read_checkpoint_file(write("mixed.ckpt", mixed));
        } catch (const CheckpointError& e) {
          EXPECT_NE(std::string(e.what()).find("corrupted"), std::string::npos) << e.what();
          throw;
        }
      },
      CheckpointError);
  std::string future = bytes;
  put_le(future, 8, 5, 4);
  EXPECT_THROW(
      {
        try {
          read_checkpoint_file(write("v5.ckpt", future));
        } catch (const CheckpointError& e) {
          EXPECT_NE(std::string(e.what()).find("container version 5; this fulgor reads versions 2 to 4"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      CheckpointError);
}

// Note [Loading without a copy]: the module's own tensors receive the values,
// taking the loaded memory where nothing else sees theirs.
TEST(Checkpoint, LoadingKeepsTheModulesTensorsAndSharesNothingNew) {
  TempDir dir;
  auto model = wide_model();
  const fs::path path = dir.path / "model.ckpt";
  fitted_one_epoch(dir, *model)->save_checkpoint(path.string());

  auto copy = wide_model();
  std::vector<const c10::TensorImpl*> before;
  for (const auto& p : copy->parameters()) before.push_back(p.unsafeGetTensorImpl());
  load_module_weights(*copy, path.string());
  EXPECT_TRUE(same_parameters(*copy, *model));
  const auto after = copy->parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i].unsafeGetTensorImpl(), before[i]) << i;

  // Two modules loaded from one archive do not come to share memory.
  auto archive = read_checkpoint_file(path.string());
  torch::serialize::InputArchive weights;
  ASSERT_TRUE(archive.try_read("model", weights));
  auto first = wide_model(), second = wide_model();
  detail::load_module_state(*first, weights, path.string());
  detail::load_module_state(*second, weights, path.string());
  EXPECT_TRUE(same_parameters(*first, *model));
  EXPECT_TRUE(same_parameters(*second, *model));
  const auto a = first->parameters(), b = second->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i].data_ptr(), b[i].data_ptr()) << i;
}

// Tensors that share memory keep sharing it: the values are copied in.
TEST(Checkpoint, LoadingIntoViewsOfOneBufferCopies) {
  struct Halves : torch::nn::Module {
    torch::Tensor whole = torch::zeros({8});
    Halves() {
      register_buffer("low", whole.narrow(0, 0, 4));
      register_buffer("high", whole.narrow(0, 4, 4));
    }
  };
  TempDir dir;
  Halves saved;
  saved.named_buffers()["low"].fill_(1);
  saved.named_buffers()["high"].fill_(2);
  torch::serialize::OutputArchive out;
  saved.save(out);
  const std::string path = (dir.path / "halves.pt").string();
  out.save_to(path);
  torch::serialize::InputArchive in;
  in.load_from(path);
  Halves loaded;
  detail::load_module_state(loaded, in, path);
  EXPECT_TRUE(loaded.whole.equal(torch::tensor({1., 1., 1., 1., 2., 2., 2., 2.}, torch::kFloat)));
}

// ---- ckpt_path "last" (Note [Resolving "last"]) ------------------------------

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
TEST(Checkpoint, LastWithoutACheckpointWarnsAndTrainsFromScratch) {
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
TEST(Checkpoint, LastIsTheMostRecentlyModifiedLastCheckpoint) {
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
TEST(Checkpoint, LastNeverChoosesTheTemporaryOfAnInterruptedSave) {
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

// ---- Temporaries left by killed writers -------------------------------------

std::set<std::string> temporaries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) names.insert(e.path().filename().string());
  return names;
}

TEST(Checkpoint, TheFirstSaveIntoAFolderRemovesStaleTemporariesButNotLiveOnes) {
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
TEST(Checkpoint, SavesSurviveSweepsOfTheirFolderRunningAlongside) {
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
TEST(Checkpoint, AWriterKilledAtRandomMomentsLeavesLoadableCheckpoints) {
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
