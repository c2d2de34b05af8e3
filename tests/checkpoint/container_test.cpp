// The container (Note [Checked chunks]): every chunk hashed as xxhsum checks
// it, files of earlier versions read, and loading into the module's own tensors.

#include <fmt/format.h>

#include <cstdio>
#include <regex>

#include "support/fitted.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

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
TEST(CheckpointContainer, XxhsumChecksTheStoredHashes) {
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
TEST(CheckpointContainer, EveryChunkIsChecked) {
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
TEST(CheckpointContainer, ReadsVersion2And3Files) {
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
TEST(CheckpointContainer, LoadingKeepsTheModulesTensorsAndSharesNothingNew) {
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
TEST(CheckpointContainer, LoadingIntoViewsOfOneBufferCopies) {
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

}  // namespace
}  // namespace fulgor::testing
