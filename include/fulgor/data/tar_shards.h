#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fulgor/core/export.h"
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
/// `{a,b}`: alternatives). Each sample's place in its shard comes from the
/// shard's index file (`SHARD.idx`, which fulgor-shard and write_index
/// write) where there is one, else from one sequential pass over the shard's
/// headers, here. With an index for every shard, samples are read in any
/// order (an epoch's permutation, as for a folder); without, streams() asks
/// a loader to read each shard in order, shuffled by shard and a buffer
/// (WebDataset's way), so that reads stay sequential. The shards stay open
/// for the data set's life (copies share them): a read is one positioned
/// read (pread) of the member, from any thread, without reopening the shard.
/// Reads ustar, GNU and pax archives, which Python's tarfile writes.
///
/// Throws DataError naming the shard and member when a shard is missing or
/// not a tar archive, a member is truncated, a sample has no image or no
/// class, or a class is not an integer >= 0; naming the index when it is
/// not one, or was written for another version of its shard.
class FULGOR_API TarShards final : public ImageDataset {
 public:
  /// `use_index` false: index files are ignored, the shards streamed.
  explicit TarShards(const std::vector<std::string>& shards, bool use_index = true);

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  void read(int64_t index, std::vector<uint8_t>& bytes) const override;
  int64_t target(int64_t index) const override { return samples_[static_cast<size_t>(index)].target; }
  std::string name(int64_t index) const override;
  /// "0", "1", ...: the classes the shards' .cls members name.
  const std::vector<std::string>& classes() const override { return classes_; }
  const std::vector<std::string>& shards() const { return shards_; }
  /// Samples per shard, in order, unless every shard has its index.
  std::vector<int64_t> streams() const override;
  bool indexed() const { return indexed_; }

  /// Writes the index of one shard next to it (`shard + ".idx"`: a line
  /// `fulgor-tar-index 1 SHARD_BYTES SAMPLES`, then `OFFSET SIZE CLASS
  /// MEMBER` for each sample's image) and returns its path.
  static std::string write_index(const std::string& shard);

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
  bool load_index(size_t shard);

  std::vector<std::string> shards_;
  std::shared_ptr<Files> files_;
  std::vector<Sample> samples_;
  std::vector<std::string> classes_;
  std::vector<int64_t> counts_;  // samples per shard
  bool indexed_ = true;
};

}  // namespace fulgor
