// torch_load against files Python's torch.save wrote (torch_files.py).

#include <fulgor/core/error.h>
#include <fulgor/interop/torch_load.h>

#include <fstream>
#include <iterator>

#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

std::map<std::string, torch::Tensor> tensors_of(const c10::IValue& dict) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& entry : dict.toGenericDict())
    if (entry.value().isTensor()) out.emplace(entry.key().toStringRef(), entry.value().toTensor());
  return out;
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(TorchLoad, ReadsEveryDtypeViewAndSharedStorageBitForBit) {
  c10::IValue loaded = torch_load(reference_dir() / "state_dict.pt");
  ASSERT_TRUE(loaded.isGenericDict());
  expect_tensors(tensors_of(loaded), expected()["state_dict"]);
  // In the order Python saved them.
  std::vector<std::string> keys;
  for (const auto& entry : loaded.toGenericDict()) keys.push_back(entry.key().toStringRef());
  std::vector<std::string> want;
  for (const auto& [name, w] : expected()["state_dict"].items()) want.push_back(name);
  std::sort(want.begin(), want.end());
  std::vector<std::string> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, want);
  EXPECT_EQ(keys.front(), "float32");
  EXPECT_EQ(keys.back(), "param");
}

TEST(TorchLoad, ReadsThePythonValuesAroundTheTensors) {
  c10::IValue loaded = torch_load(reference_dir() / "container.pt");
  auto dict = loaded.toGenericDict();
  expect_tensors(tensors_of(dict.at("state_dict")), expected()["state_dict"]);
  EXPECT_EQ(dict.at("epoch").toInt(), 3);
  EXPECT_EQ(dict.at("lr").toDouble(), 0.125);
  EXPECT_EQ(dict.at("name").toStringRef(), "net");
  auto flags = dict.at("flags").toList();
  ASSERT_EQ(flags.size(), 3u);
  EXPECT_TRUE(flags.get(0).toBool());
  EXPECT_FALSE(flags.get(1).toBool());
  EXPECT_TRUE(flags.get(2).isNone());
  EXPECT_EQ(dict.at("pair").toTupleRef().elements()[1].toInt(), -(int64_t{1} << 40));
  EXPECT_EQ(dict.at("big").toStringRef(), expected()["extras"]["big"].get<std::string>());
  EXPECT_EQ(dict.at("neg_big").toStringRef(), expected()["extras"]["neg_big"].get<std::string>());
  std::string blob = dict.at("blob").toStringRef();
  EXPECT_EQ(hex_of(torch::from_blob(blob.data(), {static_cast<int64_t>(blob.size())}, torch::kUInt8)),
            expected()["extras"]["blob"].get<std::string>());
  auto shape = dict.at("shape").toTupleRef().elements();
  ASSERT_EQ(shape.size(), 2u);
  EXPECT_EQ(shape[0].toInt() * 10 + shape[1].toInt(), 23);
  EXPECT_EQ(static_cast<torch::ScalarType>(dict.at("dtype").toInt()), torch::kBFloat16);
  EXPECT_EQ(dict.at("members").toList().get(0).toInt(), 5);
}

TEST(TorchLoad, LoadsStoragesSavedOnAnyDeviceOntoTheCpuOrTheRequestedDevice) {
  for (const char* file : {"on_cuda_1.pt", "on_npu_0.pt", "on_privateuseone.pt", "on_mps.pt", "on_xpu.pt"}) {
    SCOPED_TRACE(file);
    expect_tensors(tensors_of(torch_load(reference_dir() / file)), expected()["devices"]);
    TorchLoadOptions options;
    options.map_location = torch::Device(torch::kCPU);
    auto moved = tensors_of(torch_load(reference_dir() / file, options));
    EXPECT_EQ(moved.at("w").device(), torch::Device(torch::kCPU));
    expect_tensors(moved, expected()["devices"]);
  }
}

TEST(TorchLoad, TensorsAliasTheFileCopyOnWrite) {
  ScratchDir dir("torch_load_cow");
  fs::copy_file(reference_dir() / "state_dict.pt", dir.path() / "a.pt");
  std::string before = bytes_of(dir.path() / "a.pt");
  {
    auto tensors = tensors_of(torch_load(dir.path() / "a.pt"));
    tensors.at("base").fill_(7);
    EXPECT_EQ(tensors.at("transposed")[0][0].item<float>(), 7.0f);  // the view sees it
  }
  EXPECT_EQ(bytes_of(dir.path() / "a.pt"), before);
}

TEST(TorchLoad, RefusesOsSystemAndEvalByNameRunningNothing) {
  for (const char* label : {"os_system", "builtins_eval"}) {
    SCOPED_TRACE(label);
    std::string name = expected()[label].get<std::string>();
    try {
      torch_load(reference_dir() / (std::string(label) + ".pt"));
      ADD_FAILURE() << "loaded a pickle that calls " << name;
    } catch (const InteropError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(reference_dir() / "pwned"));
  }
}

TEST(TorchLoad, RefusesEveryTruncation) {
  ScratchDir dir("torch_load_truncated");
  std::string bytes = bytes_of(reference_dir() / "container.pt");
  for (size_t length = 0; length < bytes.size(); length += 1 + length / 64) {
    write_bytes(dir.path() / "t.pt", bytes.substr(0, length));
    EXPECT_THROW(torch_load(dir.path() / "t.pt"), InteropError) << "cut at " << length << " of " << bytes.size();
  }
}

// A flip inside a record (the pickle, a storage) fails its CRC; one elsewhere
// is refused or, where the zip format ignores the byte, loads the same values.
TEST(TorchLoad, RefusesBitFlipsInRecordsAndNeverMisreads) {
  ScratchDir dir("torch_load_flipped");
  std::string bytes = bytes_of(reference_dir() / "state_dict.pt");
  auto reference = tensors_of(torch_load(reference_dir() / "state_dict.pt"));
  std::vector<bool> in_record(bytes.size());
  for (const auto& span : expected()["state_dict_records"])
    for (size_t i = 0; i < span[1].get<size_t>(); ++i) in_record.at(span[0].get<size_t>() + i) = true;
  for (size_t at = 0; at < bytes.size(); at += 5) {
    std::string flipped = bytes;
    flipped[at] = static_cast<char>(flipped[at] ^ (1 << (at % 8)));
    write_bytes(dir.path() / "f.pt", flipped);
    try {
      auto tensors = tensors_of(torch_load(dir.path() / "f.pt"));
      EXPECT_FALSE(in_record[at]) << "a flip at " << at << ", inside a record, was not noticed";
      for (const auto& [name, t] : reference) EXPECT_EQ(hex_of(tensors.at(name)), hex_of(t)) << "flip at " << at;
    } catch (const InteropError&) {
    }
  }
}

TEST(TorchLoad, NamesWhatIsWrongWithFilesThatAreNotTorchSaveArchives) {
  ScratchDir dir("torch_load_wrong");
  write_bytes(dir.path() / "legacy.pt", std::string("\x80\x02\x8a\x0alegacy", 12));
  try {
    torch_load(dir.path() / "legacy.pt");
    ADD_FAILURE();
  } catch (const InteropError& e) {
    EXPECT_NE(std::string(e.what()).find("legacy"), std::string::npos) << e.what();
  }
  EXPECT_THROW(torch_load(dir.path() / "missing.pt"), InteropError);
}

}  // namespace
}  // namespace fulgor::interop_test
