#include "archive/zip_reader.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <cstring>
#include <thread>
#include <vector>

#include "fulgor/core/error.h"

namespace fulgor::detail {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr size_t kEndSize = 22;

uint64_t little_endian(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The zip64 extra field's values, each present only where the central
// header's 32-bit field is saturated.
void apply_zip64_extra(const uint8_t* extra, size_t length, uint64_t& size, uint64_t& compressed,
                       uint64_t& offset) {
  size_t at = 0;
  while (at + 4 <= length) {
    uint64_t id = little_endian(extra + at, 2), field = little_endian(extra + at + 2, 2);
    if (at + 4 + field > length) return;
    if (id == 1) {
      const uint8_t* p = extra + at + 4;
      const uint8_t* end = p + field;
      for (uint64_t* value : {&size, &compressed, &offset}) {
        if (*value != 0xFFFFFFFFu) continue;
        if (p + 8 > end) return;
        *value = little_endian(p, 8);
        p += 8;
      }
    }
    at += 4 + field;
  }
}

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  const RegularFile file = open_regular<InteropError>(path.string(), "");
  return map(file, path.string(), 0, std::numeric_limits<uint64_t>::max());
}

std::shared_ptr<MappedFile> MappedFile::map(const RegularFile& file, const std::string& name, uint64_t offset,
                                            uint64_t length) {
  const auto size = static_cast<size_t>(file.size());
  if (length == std::numeric_limits<uint64_t>::max()) length = size - std::min<uint64_t>(offset, size);
  if (offset > size || size - offset < length)
    throw InteropError(
        fmt::format("'{}' is truncated: it has {} bytes, {} from byte {} on are needed", name, size, length, offset));
  void* data = nullptr;
  if (size > 0) {
    // Private and writable: tensors over the mapping may be changed in place
    // without the file changing (copy-on-write).
    data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, file.fd(), 0);
    if (data == MAP_FAILED) throw InteropError(fmt::format("cannot map '{}': {}", name, std::strerror(errno)));
  }
  auto* base = static_cast<uint8_t*>(data);
  auto mapped = std::shared_ptr<MappedFile>(
      new MappedFile(base == nullptr ? nullptr : base + offset, static_cast<size_t>(length), true, name));
  mapped->base_ = base;
  mapped->mapped_size_ = size;
  return mapped;
}

std::shared_ptr<MappedFile> MappedFile::copy_of(const void* data, size_t size, std::string name) {
  auto* copy = static_cast<uint8_t*>(std::malloc(size == 0 ? 1 : size));
  if (size > 0) std::memcpy(copy, data, size);
  return std::shared_ptr<MappedFile>(new MappedFile(copy, size, false, std::move(name)));
}

MappedFile::~MappedFile() {
  if (mapped_) {
    if (base_ != nullptr) munmap(base_, mapped_size_);
  } else {
    std::free(data_);
  }
}

c10::DataPtr aliasing_data_ptr(const std::shared_ptr<MappedFile>& file, uint8_t* data) {
  auto release = [](void* context) { delete static_cast<std::shared_ptr<MappedFile>*>(context); };
  return c10::DataPtr(data, new std::shared_ptr<MappedFile>(file), release, c10::Device(c10::kCPU));
}

bool looks_like_zip(const uint8_t* data, size_t size) {
  return size >= 4 && little_endian(data, 4) == kLocalHeader;
}

ZipReader::ZipReader(std::shared_ptr<MappedFile> file, bool deflated) : file_(std::move(file)), deflated_(deflated) {
  const uint8_t* data = file_->data();
  size_t size = file_->size();
  if (size < kEndSize) throw InteropError(fmt::format("'{}' is too short to be a zip archive ({} bytes)", file_->name(), size));
  // The end record sits in the last 22 bytes plus a comment of at most 64 KiB.
  size_t end = size - kEndSize;
  size_t lowest = size > kEndSize + 0xFFFF ? size - kEndSize - 0xFFFF : 0;
  while (little_endian(data + end, 4) != kEndOfCentralDirectory) {
    if (end == lowest)
      throw InteropError(fmt::format("'{}' is not a zip archive, or is truncated: no end of central directory",
                                     file_->name()));
    --end;
  }
  uint64_t count = little_endian(data + end + 10, 2);
  uint64_t offset = little_endian(data + end + 16, 4);
  if ((count == 0xFFFF || offset == 0xFFFFFFFFu) && end >= 20 && little_endian(data + end - 20, 4) == kZip64Locator) {
    uint64_t zip64 = little_endian(data + end - 12, 8);
    if (zip64 > size || size - zip64 < 56 || little_endian(data + zip64, 4) != kZip64End)
      throw InteropError(fmt::format("'{}': the zip64 end record is missing or corrupted", file_->name()));
    count = little_endian(data + zip64 + 32, 8);
    offset = little_endian(data + zip64 + 48, 8);
  }
  read_central_directory(offset, count);
}

void ZipReader::read_central_directory(size_t offset, size_t count) {
  const uint8_t* data = file_->data();
  size_t size = file_->size();
  struct Span {
    uint64_t begin, end;
    const std::string* name;
    bool operator<(const Span& other) const { return begin < other.begin; }
  };
  std::vector<Span> spans;
  for (size_t i = 0; i < count; ++i) {
    if (offset > size || size - offset < 46 || little_endian(data + offset, 4) != kCentralHeader)
      throw InteropError(fmt::format("'{}': central directory entry {} of {} is missing or corrupted", file_->name(),
                                     i, count));
    const uint8_t* h = data + offset;
    uint64_t method = little_endian(h + 10, 2), crc = little_endian(h + 16, 4);
    uint64_t compressed = little_endian(h + 20, 4), length = little_endian(h + 24, 4);
    size_t name_length = little_endian(h + 28, 2), extra = little_endian(h + 30, 2), comment = little_endian(h + 32, 2);
    uint64_t local = little_endian(h + 42, 4);
    if (size - offset - 46 < name_length + extra + comment)
      throw InteropError(fmt::format("'{}': the central directory is truncated", file_->name()));
    std::string name(reinterpret_cast<const char*>(h + 46), name_length);
    apply_zip64_extra(h + 46 + name_length, extra, length, compressed, local);
    const bool deflated = deflated_ && method == 8;
    if (!deflated && (method != 0 || compressed != length))
      throw InteropError(fmt::format("'{}': record '{}' is compressed (method {}); torch.save and fulgor store "
                                     "records uncompressed",
                                     file_->name(), name, method));
    if (local > size || size - local < 30 || little_endian(data + local, 4) != kLocalHeader)
      throw InteropError(fmt::format("'{}': the local header of record '{}' is missing or corrupted", file_->name(), name));
    uint64_t start = local + 30 + little_endian(data + local + 26, 2) + little_endian(data + local + 28, 2);
    if (start > size || size - start < compressed)
      throw InteropError(fmt::format("'{}' is truncated: record '{}' needs {} bytes at offset {}, the file has {}",
                                     file_->name(), name, compressed, start, size));
    if (!records_.emplace(name, ZipRecord{start, length, static_cast<uint32_t>(crc), compressed, deflated}).second)
      throw InteropError(fmt::format("'{}': record '{}' appears twice", file_->name(), name));
    spans.push_back({local, start + compressed, &records_.find(name)->first});
    offset += 46 + name_length + extra + comment;
  }
  // Each record from its local header to its data's end, in the file's order.
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end)
      throw InteropError(fmt::format("'{}': records '{}' and '{}' overlap; fulgor refuses zip archives whose records "
                                     "share bytes",
                                     file_->name(), *spans[i - 1].name, *spans[i].name));
}

uint8_t* ZipReader::read(const std::string& name, size_t* size) const {
  auto it = records_.find(name);
  if (it == records_.end()) throw InteropError(fmt::format("'{}' has no record '{}'", file_->name(), name));
  if (it->second.deflated)
    throw InteropError(fmt::format("'{}': record '{}' is compressed; fulgor reads it stored", file_->name(), name));
  *size = it->second.size;
  return file_->data() + it->second.offset;
}

std::string ZipReader::read_copy(const std::string& name, size_t limit) const {
  auto it = records_.find(name);
  if (it == records_.end()) throw InteropError(fmt::format("'{}' has no record '{}'", file_->name(), name));
  const ZipRecord& record = it->second;
  if (record.size > limit)
    throw InteropError(fmt::format("'{}': record '{}' holds {} bytes; fulgor reads up to {} of it", file_->name(),
                                   name, record.size, limit));
  const auto* stored = reinterpret_cast<const char*>(file_->data() + record.offset);
  std::string out(record.size, '\0');
  if (!record.deflated) {
    std::memcpy(out.data(), stored, record.size);
  } else {
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw InteropError("zlib cannot start an inflater");
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(stored));
    z.avail_in = static_cast<uInt>(record.stored_size);
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(record.size);
    const int status = inflate(&z, Z_FINISH);
    const bool whole = status == Z_STREAM_END && z.total_out == record.size;
    inflateEnd(&z);
    if (!whole)
      throw InteropError(fmt::format("'{}': record '{}' does not inflate to its {} bytes", file_->name(), name,
                                     record.size));
  }
  if (crc32_z(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(out.data()), out.size()) != record.crc32)
    throw InteropError(fmt::format("'{}' is corrupted: record '{}' fails its CRC-32 check", file_->name(), name));
  return out;
}

// Note [Checking CRCs in parallel]
// The CRC-32 of every record is most of the time torch_load takes: the
// storages themselves are only mapped. The records are cut into chunks of
// 8 MiB, checked on all cores, and each record's chunk CRCs are combined
// (zlib's crc32_combine) into the record's.
void ZipReader::verify() const {
  constexpr size_t kChunk = size_t{8} << 20;
  struct Chunk {
    const std::string* name;
    const ZipRecord* record;
    size_t offset, size;
    uLong crc;
  };
  std::vector<Chunk> chunks;
  for (const auto& [name, record] : records_) {
    size_t offset = 0;
    do {
      chunks.push_back({&name, &record, offset, std::min(kChunk, record.size - offset), 0});
      offset += kChunk;
    } while (offset < record.size);
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < chunks.size();) {
      Chunk& c = chunks[i];
      c.crc = crc32_z(crc32(0L, Z_NULL, 0), file_->data() + c.record->offset + c.offset, c.size);
    }
  };
  size_t workers = std::min<size_t>({std::thread::hardware_concurrency(), 8, chunks.size()});
  std::vector<std::thread> threads;
  for (size_t i = 1; i < workers; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < chunks.size(); ++i) {
    uLong crc = chunks[i].crc;
    while (i + 1 < chunks.size() && chunks[i + 1].record == chunks[i].record) {
      crc = crc32_combine(crc, chunks[i + 1].crc, static_cast<z_off_t>(chunks[i + 1].size));
      ++i;
    }
    if (static_cast<uint32_t>(crc) != chunks[i].record->crc32)
      throw InteropError(fmt::format("'{}' is corrupted: record '{}' fails its CRC-32 check (stored {:08x}, computed "
                                     "{:08x})",
                                     file_->name(), *chunks[i].name, chunks[i].record->crc32,
                                     static_cast<uint32_t>(crc)));
  }
}

}  // namespace fulgor::detail
