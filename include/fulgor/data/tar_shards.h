#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fulgor/data/image_folder.h"

namespace fulgor {

/// WebDataset-style tar shards as an ImageDataset. A shard's members are
/// grouped into samples by key, as WebDataset groups them: consecutive
/// members sharing the path up to the first dot of the file name
/// (`train/0001.jpg`, `train/0001.cls`, `train/0001.json` are sample
/// `train/0001`). A sample has one image (`.jpg`, `.jpeg` or `.png`) and its
/// class index as text (`.cls`); other members (`.json`) are ignored.
///
/// `shards` are paths, each possibly a brace pattern as WebDataset's
/// (`train-{0000..0099}.tar`: a numeric range, zero-padded as written;
/// `{a,b}`: alternatives). The shards' headers are read once, here, into an
/// index of every sample's place, so that samples can then be read in any
/// order (an epoch's permutation) with one read each. The shards stay open
/// for the data set's life (copies share them): a read is one positioned
/// read (pread) of the member, from any thread, without reopening the shard.
/// Reads ustar, GNU and pax archives, which Python's tarfile writes.
///
/// Throws DataError naming the shard and member when a shard is missing or
/// not a tar archive, a member is truncated, a sample has no image or no
/// class, or a class is not an integer >= 0.
class TarShards final : public ImageDataset {
 public:
  explicit TarShards(const std::vector<std::string>& shards);

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  void read(int64_t index, std::vector<uint8_t>& bytes) const override;
  int64_t target(int64_t index) const override { return samples_[static_cast<size_t>(index)].target; }
  std::string name(int64_t index) const override;
  /// "0", "1", ...: the classes the shards' .cls members name.
  const std::vector<std::string>& classes() const override { return classes_; }
  const std::vector<std::string>& shards() const { return shards_; }

  /// A brace pattern's paths, in order.
  static std::vector<std::string> expand(const std::string& pattern);

 private:
  struct Sample {
    size_t shard;
    uint64_t offset, size;
    int64_t target;
    std::string member;
  };
  struct Files;  // the shards' open descriptors
  void scan(size_t shard);

  std::vector<std::string> shards_;
  std::shared_ptr<Files> files_;
  std::vector<Sample> samples_;
  std::vector<std::string> classes_;
};

}  // namespace fulgor
