#pragma once

// Fashion-MNIST read from the gzip-compressed IDX files Debian's
// dataset-fashion-mnist package installs (or any folder holding them).

#include <torch/torch.h>
#include <zlib.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fashion_mnist {

inline const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";

inline std::vector<uint8_t> gunzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file)
    throw std::runtime_error("cannot open " + path +
                             " (install Debian's dataset-fashion-mnist package, or pass --data.dir=FOLDER)");
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  int n = 0;
  while ((n = gzread(file, chunk, sizeof(chunk))) > 0) bytes.insert(bytes.end(), chunk, chunk + n);
  const bool failed = n < 0;
  gzclose(file);
  if (failed) throw std::runtime_error("cannot decompress " + path + ": not a valid gzip file");
  return bytes;
}

inline uint32_t big_endian(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t(b[at]) << 24) | (uint32_t(b[at + 1]) << 16) | (uint32_t(b[at + 2]) << 8) | uint32_t(b[at + 3]);
}

// Images as float [N, 1, 28, 28] scaled to [0, 1], labels as int64 [N].
inline std::pair<torch::Tensor, torch::Tensor> load(const std::string& dir, bool train) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  auto images = gunzip(prefix + "-images-idx3-ubyte.gz");
  auto labels = gunzip(prefix + "-labels-idx1-ubyte.gz");
  if (images.size() < 16 || big_endian(images, 0) != 2051)
    throw std::runtime_error(prefix + "-images-idx3-ubyte.gz is not an IDX image file");
  if (labels.size() < 8 || big_endian(labels, 0) != 2049)
    throw std::runtime_error(prefix + "-labels-idx1-ubyte.gz is not an IDX label file");
  const int64_t n = big_endian(images, 4), rows = big_endian(images, 8), cols = big_endian(images, 12);
  if (static_cast<int64_t>(big_endian(labels, 4)) != n || images.size() != size_t(16 + n * rows * cols) ||
      labels.size() != size_t(8 + n))
    throw std::runtime_error(prefix + ": image and label files do not match or are truncated");
  auto x = torch::from_blob(images.data() + 16, {n, 1, rows, cols}, torch::kUInt8).to(torch::kFloat32).div_(255);
  auto y = torch::from_blob(labels.data() + 8, {n}, torch::kUInt8).to(torch::kInt64);
  return {x, y};
}

// Rows [begin, end) of a loaded split, served one example at a time and
// collated by the loader's Stack<>.
struct Dataset : torch::data::datasets::Dataset<Dataset> {
  torch::Tensor images, labels;
  Dataset(torch::Tensor x, torch::Tensor y) : images(std::move(x)), labels(std::move(y)) {}
  torch::data::Example<> get(size_t i) override {
    return {images[static_cast<int64_t>(i)], labels[static_cast<int64_t>(i)]};
  }
  c10::optional<size_t> size() const override { return static_cast<size_t>(images.size(0)); }
};

}  // namespace fashion_mnist
