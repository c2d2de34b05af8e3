#pragma once

// The zip container of torch.save files, read from a memory-mapped file.
//
// Note [Reading the zip ourselves]
// LibTorch's PyTorchStreamReader copies each record into a fresh buffer;
// a state dict of gigabytes would be read twice and held twice. This reader
// maps the file and hands out pointers into the mapping, so storages can
// alias it (copy-on-write: a tensor written to in place never changes the
// file). It accepts what PyTorchStreamWriter and Python's zipfile write:
// stored (uncompressed) records, zip64 where offsets or sizes need it. Every
// offset and size is checked against the file before it is used, records
// may not overlap (one byte read as many records is a "zip bomb"), and a
// record's CRC-32 can be checked (all of them, as torch.load checks each one it
// reads), so truncated and corrupted files are refused naming the record.

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "detail/regular_file.h"

namespace fulgor::detail {

/// A read-only view of a whole file, mapped copy-on-write.
class MappedFile {
 public:
  /// Maps `path`; throws InteropError naming it when it cannot be opened or
  /// is not a regular file (Note [Opening a user's path]).
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& path);
  /// Maps the `length` bytes of `file`, named `name`, from `offset` on (the
  /// archive inside a checkpoint; the rest of the file for `length`
  /// UINT64_MAX); throws InteropError when the file is shorter.
  static std::shared_ptr<MappedFile> map(const RegularFile& file, const std::string& name, uint64_t offset,
                                         uint64_t length);
  /// Copies `size` bytes (for inputs that are not files, like the fuzzers').
  static std::shared_ptr<MappedFile> copy_of(const void* data, size_t size, std::string name);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  MappedFile(uint8_t* data, size_t size, bool mapped, std::string name)
      : data_(data), size_(size), mapped_(mapped), name_(std::move(name)) {}
  uint8_t* data_;
  size_t size_;
  // The whole mapping, where data_ is a part of it.
  uint8_t* base_ = nullptr;
  size_t mapped_size_ = 0;
  bool mapped_;
  std::string name_;
};

/// One stored record of the archive.
struct ZipRecord {
  size_t offset = 0;  ///< of its data in the file
  size_t size = 0;    ///< uncompressed
  uint32_t crc32 = 0;
  size_t stored_size = 0;  ///< in the file: `size`, or less where deflated
  bool deflated = false;
};

/// The records of a zip archive, by name.
class ZipReader {
 public:
  /// Reads the central directory; throws InteropError when the file is not a
  /// zip archive fulgor can read, or is truncated. Deflated records are
  /// refused unless `deflated` (LibTorch's archives deflate their code).
  explicit ZipReader(std::shared_ptr<MappedFile> file, bool deflated = false);

  bool has(const std::string& name) const { return records_.count(name) != 0; }
  const std::map<std::string, ZipRecord>& records() const { return records_; }
  /// The record's bytes; throws InteropError when it is missing or deflated.
  uint8_t* read(const std::string& name, size_t* size) const;
  /// A copy of the record's bytes, inflated where deflated, its CRC-32
  /// checked; throws InteropError when it is missing, corrupted, or longer
  /// than `limit` (checked before anything is inflated).
  std::string read_copy(const std::string& name, size_t limit) const;
  /// Checks every record's CRC-32; throws InteropError naming the first that
  /// fails.
  void verify() const;
  const std::shared_ptr<MappedFile>& file() const { return file_; }

 private:
  void read_central_directory(size_t offset, size_t count);
  std::shared_ptr<MappedFile> file_;
  bool deflated_;
  std::map<std::string, ZipRecord> records_;
};

/// A CPU DataPtr to `data`, inside `file`, that keeps the file mapped for as
/// long as a storage holds it.
c10::DataPtr aliasing_data_ptr(const std::shared_ptr<MappedFile>& file, uint8_t* data);

/// Whether `data` starts as a zip archive does.
bool looks_like_zip(const uint8_t* data, size_t size);

}  // namespace fulgor::detail
