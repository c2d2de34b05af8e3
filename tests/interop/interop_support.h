#pragma once

// What the interop tests share: the reference files Python wrote (the
// interop_reference_files fixture, tests/interop/torch_files.py), and running
// Python to read what fulgor wrote.

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

namespace fulgor::interop_test {

namespace fs = std::filesystem;

inline fs::path reference_dir() { return FULGOR_INTEROP_REFERENCE_DIR; }

inline const nlohmann::json& expected() {
  static const nlohmann::json json = [] {
    std::ifstream in(reference_dir() / "expected.json");
    if (!in) throw std::runtime_error("no " + (reference_dir() / "expected.json").string() +
                                      ": run ctest, whose interop_reference_files fixture writes it");
    return nlohmann::json::parse(in);
  }();
  return json;
}

inline torch::ScalarType dtype_named(const std::string& name) {
  static const std::map<std::string, torch::ScalarType> table = {
      {"float32", torch::kFloat32}, {"float64", torch::kFloat64}, {"float16", torch::kFloat16},
      {"bfloat16", torch::kBFloat16}, {"int64", torch::kInt64}, {"int32", torch::kInt32},
      {"int16", torch::kInt16}, {"int8", torch::kInt8}, {"uint8", torch::kUInt8}, {"bool", torch::kBool}};
  return table.at(name);
}

inline std::string dtype_name(torch::ScalarType dtype) {
  for (const char* name : {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"})
    if (dtype_named(name) == dtype) return name;
  return c10::toString(dtype);
}

/// The tensor's values, row-major, as hex bytes (as torch_files.py writes them).
inline std::string hex_of(const torch::Tensor& tensor) {
  torch::Tensor t = tensor.detach().cpu().contiguous();
  auto* p = static_cast<const uint8_t*>(t.data_ptr());
  std::string out;
  char buffer[3];
  for (size_t i = 0; i < t.nbytes(); ++i) {
    std::snprintf(buffer, sizeof buffer, "%02x", p[i]);
    out += buffer;
  }
  return out;
}

/// Expects `tensors` to be what `want` (a describe() of torch_files.py) says,
/// bit for bit, with the same strides, offsets and shared storages.
inline void expect_tensors(const std::map<std::string, torch::Tensor>& tensors, const nlohmann::json& want) {
  std::map<int64_t, const void*> storages;
  ASSERT_EQ(tensors.size(), want.size());
  for (const auto& [name, w] : want.items()) {
    SCOPED_TRACE(name);
    ASSERT_EQ(tensors.count(name), 1u);
    const torch::Tensor& t = tensors.at(name);
    EXPECT_EQ(dtype_name(t.scalar_type()), w["dtype"].get<std::string>());
    EXPECT_EQ(t.sizes().vec(), w["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.strides().vec(), w["stride"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.storage_offset(), w["offset"].get<int64_t>());
    EXPECT_EQ(hex_of(t), w["hex"].get<std::string>());
    EXPECT_EQ(t.requires_grad(), w["requires_grad"].get<bool>());
    const void* storage = t.storage().data();
    auto [it, fresh] = storages.emplace(w["storage"].get<int64_t>(), storage);
    EXPECT_EQ(it->second, storage) << "shares a storage in Python, not here";
    if (!fresh) continue;
    for (const auto& [group, other] : storages) {
      if (group != w["storage"].get<int64_t>()) {
        EXPECT_NE(other, storage) << "shares a storage here, not in Python";
      }
    }
  }
}

/// Runs Debian's python3 (which has python3-torch) with `arguments`; returns
/// its exit status, its output in `output`.
inline int run_python(const std::string& arguments, std::string* output) {
  std::string command = std::string(FULGOR_DEBIAN_PYTHON3) + " " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  output->clear();
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output->append(buffer, n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// A folder of its own, removed afterwards.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("fulgor_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace fulgor::interop_test
