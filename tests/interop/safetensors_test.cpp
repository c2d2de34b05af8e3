// .safetensors both ways, against files written by the format's
// specification (torch_files.py), and its reader's refusals.

#include <fmt/format.h>
#include <fulgor/core/error.h>
#include <fulgor/detail/compat.h>
#include <fulgor/interop/safetensors.h>

#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

std::map<std::string, torch::Tensor> as_map(const StateDict& state) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : state) out.emplace(e.key(), e.value());
  return out;
}

// A file of `header` (padded as given) followed by `data` bytes.
fs::path file_of(const ScratchDir& dir, const std::string& header, size_t data, uint64_t length = 0) {
  static int count = 0;
  fs::path path = dir.path() / fmt::format("case{}.safetensors", count++);
  std::ofstream out(path, std::ios::binary);
  if (length == 0) length = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(length >> (8 * i)));
  out << header << std::string(data, '\0');
  return path;
}

TEST(Safetensors, ReadsThePythonFileBitForBitWithItsMetadata) {
  Safetensors file = read_safetensors(reference_dir() / "tensors.safetensors");
  expect_tensors(as_map(file.tensors), expected()["safetensors"]);
  EXPECT_EQ(file.metadata, (expected()["safetensors_metadata"].get<std::map<std::string, std::string>>()));
}

TEST(Safetensors, WritesWhatTheFormatsSpecificationReadsAndReadsItBack) {
  ScratchDir dir("safetensors_write");
  Safetensors python = read_safetensors(reference_dir() / "tensors.safetensors");
  write_safetensors(python.tensors, dir.path() / "out.safetensors", python.metadata);
  std::string output;
  EXPECT_EQ(run_python(fmt::format("{}/torch_files.py safetensors {} {}", FULGOR_INTEROP_SCRIPTS,
                                   (dir.path() / "out.safetensors").string(), (reference_dir() / "expected.json").string()),
                       &output),
            0)
      << output;
  Safetensors again = read_safetensors(dir.path() / "out.safetensors");
  expect_tensors(as_map(again.tensors), expected()["safetensors"]);
  EXPECT_EQ(again.metadata, python.metadata);
  // Views are written as their values.
  auto base = torch::arange(12, torch::kInt32).reshape({3, 4});
  write_safetensors(StateDict({{"t", base.t()}}), dir.path() / "view.safetensors");
  EXPECT_TRUE(torch::equal(read_safetensors(dir.path() / "view.safetensors").tensors["t"], base.t()));
}

TEST(Safetensors, RefusesWhatTheFormatsReaderRefuses) {
  ScratchDir dir("safetensors_refused");
  auto refuses = [&](const fs::path& path, const std::string& words) {
    try {
      read_safetensors(path);
      ADD_FAILURE() << "read " << path << ", expected: " << words;
    } catch (const InteropError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  refuses(file_of(dir, "{" + a + "}", 0, 200'000'000), "over safetensors' limit");
  refuses(file_of(dir, "{" + a + "}", 0, 4000), "truncated");
  refuses(file_of(dir, "{" + a + "}", 4), "truncated");
  refuses(file_of(dir, "[1,2]", 0), "not a JSON object");
  refuses(file_of(dir, "{" + a + ",", 8), "not valid JSON");
  refuses(file_of(dir, "{" + a + "," + a + "}", 8), "names 'a' twice");
  refuses(file_of(dir, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes");
  refuses(file_of(dir, "{" + a + R"(,"b":{"dtype":"I8","shape":[4],"data_offsets":[4,8]}})", 8), "not overlap");
  refuses(file_of(dir, "{" + a + R"(,"b":{"dtype":"I8","shape":[4],"data_offsets":[12,16]}})", 16), "not overlap");
  refuses(file_of(dir, "{" + a + "}", 12), "the data is 12 bytes long");
  refuses(file_of(dir, "{" + a + R"(,"__metadata__":{"k":1}})", 8), "'k' is not a string");
  refuses(file_of(dir, R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1), "dtype Q7");
  refuses(file_of(dir, R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "non-negative");
  // A name given twice with others between, found by sorting the names.
  const std::string b = R"("b":{"dtype":"I8","shape":[4],"data_offsets":[8,12]})";
  refuses(file_of(dir, "{" + a + "," + b + "," + a + "}", 12), "names 'a' twice");
  // Names past the bound are refused as they are counted, before any tensor is built.
  std::string many = "{";
  for (int i = 0; i <= 1'000'000; ++i) many += fmt::format(R"("{}":0,)", i);
  many.back() = '}';
  refuses(file_of(dir, many, 0), "declares more than 1000000 tensors");
  if (!FULGOR_TORCH_AT_LEAST(2, 3))
    refuses(file_of(dir, R"({"a":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})", 4),
            "dtype U16, which this LibTorch");
}

TEST(Safetensors, ReadsDtypesOnlyNewerLibTorchesHaveWhereThisOneHasThem) {
  if (!FULGOR_TORCH_AT_LEAST(2, 3)) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no uint16";
  ScratchDir dir("safetensors_newer");
  std::string header = R"({"a":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})";
  fs::path path = file_of(dir, header, 0);
  std::ofstream(path, std::ios::binary | std::ios::app).write("\x01\x00\xff\xff", 4);
  auto t = read_safetensors(path).tensors["a"];
  EXPECT_EQ(t.to(torch::kInt64)[1].item<int64_t>(), 65535);
}

}  // namespace
}  // namespace fulgor::interop_test
