// Files from elsewhere: fulgor checkpoints and torch.save files written to
// run code or exhaust their reader (Note [Archives that hold no code],
// Note [Pickles from elsewhere]). Each is refused with an error that names
// the file and what was refused, and nothing of it runs.

#include <fmt/format.h>
#include <fulgor/checkpoint/checkpoint.h>
#include <fulgor/core/error.h>
#include <fulgor/interop/safetensors.h>
#include <fulgor/interop/torch_load.h>
#include <fulgor/interop/torch_save.h>
#include <fulgor/interop/weights_file.h>

#include "../support/thrown.h"
#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

// A checkpoint as fulgor writes one: metadata and a model of one parameter.
void write_small_checkpoint(const fs::path& path) {
  torch::serialize::OutputArchive archive;
  archive.write("meta", c10::IValue(std::string("{}")));
  torch::serialize::OutputArchive model;
  model.write("w", torch::ones({1}));
  archive.write("model", model);
  write_checkpoint_file(path.string(), archive);
}

// `kind` planted into a valid checkpoint by tests/interop/plant_archive.py.
fs::path planted(const ScratchDir& dir, const std::string& kind, const fs::path& marker = {}) {
  const fs::path valid = dir.path() / "valid.ckpt", out = dir.path() / (kind + ".ckpt");
  write_small_checkpoint(valid);
  std::string output;
  EXPECT_EQ(run_python(fmt::format("{}/plant_archive.py {} {} {} {}", FULGOR_INTEROP_SCRIPTS, valid.string(),
                                   out.string(), kind, marker.string()),
                       &output),
            0)
      << output;
  return out;
}

std::string checkpoint_error(const fs::path& path) {
  return test::thrown_message<CheckpointError>([&] { read_checkpoint_file(path.string()); });
}

TEST(UntrustedCheckpoint, ASmallCheckpointStillLoads) {
  ScratchDir dir("untrusted_valid");
  write_small_checkpoint(dir.path() / "valid.ckpt");
  auto archive = read_checkpoint_file((dir.path() / "valid.ckpt").string());
  torch::serialize::InputArchive model;
  ASSERT_TRUE(archive.try_read("model", model));
  torch::Tensor w;
  ASSERT_TRUE(model.try_read("w", w));
  EXPECT_TRUE(torch::equal(w, torch::ones({1})));
}

TEST(UntrustedCheckpoint, ASetstateCompiledByTorchScriptNeverRuns) {
  ScratchDir dir("untrusted_setstate");
  const fs::path marker = dir.path() / "ran";
  const fs::path path = planted(dir, "setstate", marker);
  const std::string error = checkpoint_error(path);
  EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  EXPECT_NE(error.find("def __setstate__"), std::string::npos) << error;
  EXPECT_NE(error.find("is code, which fulgor refuses to load"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(marker)) << "the planted __setstate__ ran";
  EXPECT_THROW(read_weights(path), CheckpointError);
  EXPECT_FALSE(fs::exists(marker)) << "the planted __setstate__ ran";
  // The plant is live: LibTorch itself, given the bare archive, runs it.
  torch::serialize::InputArchive bare;
  try {
    bare.load_from(path.string() + ".zip");
  } catch (const c10::Error& e) {
    ADD_FAILURE() << e.what_without_backtrace();
  }
  EXPECT_TRUE(fs::exists(marker)) << "LibTorch did not run the planted __setstate__: the test plants nothing";
}

TEST(UntrustedCheckpoint, AMillionDeepTupleIsRefusedBeforeLibTorchSeesIt) {
  ScratchDir dir("untrusted_deep");
  const fs::path path = planted(dir, "deep_tuple");
  const std::string error = checkpoint_error(path);
  EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  EXPECT_NE(error.find("nest deeper than 1000 levels"), std::string::npos) << error;
}

TEST(UntrustedCheckpoint, AMemoIndexBeyondTheMemoIsRefused) {
  ScratchDir dir("untrusted_memo");
  const std::string error = checkpoint_error(planted(dir, "memo_huge"));
  EXPECT_NE(error.find("memo entry 4294967295 is written while the memo has 0"), std::string::npos) << error;
}

TEST(UntrustedCheckpoint, ALibTorchCppClassIsRefusedByName) {
  ScratchDir dir("untrusted_torchbind");
  const std::string error = checkpoint_error(planted(dir, "torchbind"));
  EXPECT_NE(error.find("'__torch__.torch.classes.quantized.LinearPackedParamsBase', which fulgor refuses"),
            std::string::npos)
      << error;
}

// tests/interop/hostile_torch_files.py, written once for the tests below.
const fs::path& hostile_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / fmt::format("fulgor_hostile_{}", getpid());
    std::string output;
    if (run_python(fmt::format("{}/hostile_torch_files.py {}", FULGOR_INTEROP_SCRIPTS, d.string()), &output) != 0)
      ADD_FAILURE() << output;
    return d;
  }();
  return dir;
}

class UntrustedTorchFile : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { fs::remove_all(hostile_dir()); }
  static std::string load_error(const std::string& name) {
    try {
      torch_load(hostile_dir() / name);
    } catch (const InteropError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find((hostile_dir() / name).string()), std::string::npos) << what;
      return what;
    }
    return "no error";
  }
};

TEST_F(UntrustedTorchFile, DeepNestingIsRefused) {
  EXPECT_NE(load_error("deep_tuple.pt").find("nest deeper than 1000 levels"), std::string::npos);
  EXPECT_NE(load_error("deep_list.pt").find("nest deeper than 1000 levels"), std::string::npos);
}

TEST_F(UntrustedTorchFile, TupleKeysAreRefusedClearly) {
  EXPECT_NE(load_error("tuple_keys.pt").find("a dict key of type Tuple"), std::string::npos);
}

TEST_F(UntrustedTorchFile, LongIntegersAreRefusedAtOnce) {
  hostile_dir();  // written before the clock starts
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(load_error("long_integers.pt").find("an integer of 4096 bytes"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(UntrustedTorchFile, ARecursiveListIsRefused) {
  EXPECT_NE(load_error("recursive_list.pt").find("a recursive structure"), std::string::npos);
}

TEST_F(UntrustedTorchFile, AMemoIndexBeyondTheMemoIsRefused) {
  EXPECT_NE(load_error("memo_huge.pt").find("memo entry 4294967295"), std::string::npos);
}

TEST_F(UntrustedTorchFile, OverlappingRecordsAreRefused) {
  EXPECT_NE(load_error("overlapping.pt").find("overlap"), std::string::npos);
}

TEST_F(UntrustedTorchFile, AnExpandedViewIsReadButNotMaterialised) {
  const fs::path path = hostile_dir() / "expanded.pt";
  StateDict state = read_weights(path);
  EXPECT_EQ(state["w"].numel(), int64_t{1} << 62);
  try {
    write_safetensors(state, hostile_dir() / "expanded.safetensors");
    ADD_FAILURE() << "a view of 2^62 elements was written";
  } catch (const InteropError& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("its storage holds 1"), std::string::npos) << e.what();
  }
}

TEST(UntrustedDestination, AFolderIsAnErrorAndNoTemporaryIsLeft) {
  ScratchDir dir("convert_to_folder");
  StateDict state;
  state.insert("w", torch::ones({2}));
  save_state_dict(state, dir.path() / "w.pt");
  for (const char* name : {"out.safetensors", "out.pt"}) {
    fs::create_directories(dir.path() / name);
    std::string output;
    FILE* pipe = popen(fmt::format("{} {} {} 2>&1", FULGOR_CONVERT, (dir.path() / "w.pt").string(),
                                   (dir.path() / name).string())
                           .c_str(),
                       "r");
    char buffer[4096];
    while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
    const int status = pclose(pipe);
    EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 1) << output;
    EXPECT_NE(output.find("it is a folder, not a regular file; name a file"), std::string::npos) << output;
  }
  for (const auto& entry : fs::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
}

}  // namespace
}  // namespace fulgor::interop_test
