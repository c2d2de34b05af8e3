#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

/// Encoded images with a class each, read by index: what an ImageLoader
/// decodes. Implementations: ImageFolder (files on disk).
///
/// Contract: size() and target() are fixed after construction; read() may be
/// called from several threads at once, and throws DataError (naming the
/// sample) when the sample cannot be read.
class FULGOR_API ImageDataset {
 public:
  virtual ~ImageDataset() = default;
  virtual int64_t size() const = 0;
  /// Sample `index`'s encoded bytes, into `bytes` (its buffer reused).
  virtual void read(int64_t index, std::vector<uint8_t>& bytes) const = 0;
  /// Its class index.
  virtual int64_t target(int64_t index) const = 0;
  /// What messages call it (a path).
  virtual std::string name(int64_t index) const = 0;
  /// The class names, index i naming class i.
  virtual const std::vector<std::string>& classes() const = 0;
  /// Empty when samples are as cheap to read in any order (files, indexed
  /// shards). Otherwise the data set is read best as streams: the sizes of
  /// its runs of consecutive indices (plain tar shards), which a loader
  /// visits in order, shuffled by shard and a buffer rather than permuted.
  virtual std::vector<int64_t> streams() const { return {}; }
};

/// torchvision's ImageFolder: root/<class>/**/<file>. The classes are the
/// sub-folders of root in sorted order, indexed from 0; a class's samples are
/// the files under its folder (followed into sub-folders and symbolic links,
/// folders in sorted path order, files sorted within each) whose names end,
/// in any case, in one of torchvision's IMG_EXTENSIONS: .jpg .jpeg .png .ppm
/// .bmp .pgm .tif .tiff .webp. Other files (a README, a .txt) are ignored.
/// fulgor decodes JPEG and PNG: a file of another format is a corrupt sample
/// to the loader, skipped with a warning or an error, by its option.
///
/// Throws DataError naming the folder when root is not a folder, has no class
/// folder, or a class has no image (torchvision's FileNotFoundError).
class FULGOR_API ImageFolder final : public ImageDataset {
 public:
  explicit ImageFolder(const std::string& root);

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  void read(int64_t index, std::vector<uint8_t>& bytes) const override;
  int64_t target(int64_t index) const override { return targets_[static_cast<size_t>(index)]; }
  std::string name(int64_t index) const override { return paths_[static_cast<size_t>(index)]; }
  const std::vector<std::string>& classes() const override { return classes_; }

  /// torchvision's IMG_EXTENSIONS.
  static const std::vector<std::string>& extensions();

 private:
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<int64_t> targets_;
};

/// Reads a whole file into `bytes`; DataError naming it when it cannot.
FULGOR_API void read_file(const std::string& path, std::vector<uint8_t>& bytes);

}  // namespace fulgor
