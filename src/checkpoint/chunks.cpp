#include "checkpoint/chunks.h"

#include <xxh_x86dispatch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "detail/huge_pages.h"
#include "detail/read_at.h"

namespace fulgor::detail {
namespace {

void append_le64(std::string& out, uint64_t value) {
  char bytes[8];
  put_le<uint64_t>(bytes, value);
  out.append(bytes, sizeof(bytes));
}

}  // namespace

ChunkHasher::ChunkHasher() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(state_.get());
}

void ChunkHasher::update(const char* bytes, size_t size) {
  while (size > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(size, kChecksumChunk - in_chunk_));
    XXH3_64bits_update_dispatch(state_.get(), bytes, take);
    bytes += take;
    size -= take;
    in_chunk_ += take;
    if (in_chunk_ == kChecksumChunk) {
      append_le64(table_, XXH3_64bits_digest(state_.get()));
      XXH3_64bits_reset(state_.get());
      in_chunk_ = 0;
    }
  }
}

std::string ChunkHasher::table() {
  if (in_chunk_ > 0) append_le64(table_, XXH3_64bits_digest(state_.get()));
  in_chunk_ = 0;
  return std::move(table_);
}

CheckedArchive::CheckedArchive(int fd, uint64_t offset, uint64_t length, std::string table)
    : fd_(fd), offset_(offset), length_(length), table_(std::move(table)), checked_(chunk_count(length), false) {}

bool CheckedArchive::read_into(char* out, uint64_t from, uint64_t size) {
  if (read_at(fd_, offset_ + from, out, size)) return true;
  // A file that ends early is named as corrupted: its chunks no longer match.
  if (errno != 0) read_error_ = errno;
  return false;
}

bool CheckedArchive::verify(uint64_t chunk, char* into) {
  const uint64_t start = chunk * kChecksumChunk;
  const uint64_t size = std::min(kChecksumChunk, length_ - start);
  if (!read_into(into, start, size)) return false;
  // Hashed just after it is read, while it is in the cache.
  if (XXH3_64bits_dispatch(into, size) != get_le<uint64_t>(&table_[8 * chunk])) {
    corrupted_ = true;
    return false;
  }
  checked_[chunk] = true;
  return true;
}

size_t CheckedArchive::read(uint64_t pos, void* buf, size_t size) {
  char* out = static_cast<char*>(buf);
  advise_huge_pages(out, size);  // Note [Huge pages for fresh tensor memory]
  size_t copied = 0;
  while (copied < size && pos < length_) {
    const uint64_t chunk = pos / kChecksumChunk, start = chunk * kChecksumChunk;
    const uint64_t chunk_end = std::min(start + kChecksumChunk, length_);
    const uint64_t end = std::min(chunk_end, pos + (size - copied));
    if (checked_[chunk]) {
      if (!read_into(out + copied, pos, end - pos)) break;
    } else if (pos == start && end == chunk_end) {
      // A whole chunk is read straight into LibTorch's buffer and checked there.
      if (!verify(chunk, out + copied)) break;
    } else {
      // Part of one goes through the scratch buffer, as all of it is hashed.
      scratch_.resize(kChecksumChunk);
      if (!verify(chunk, scratch_.data())) break;
      std::memcpy(out + copied, scratch_.data() + (pos - start), end - pos);
    }
    copied += end - pos;
    pos = end;
  }
  return copied;
}

bool CheckedArchive::check_rest() {
  scratch_.resize(kChecksumChunk);
  for (uint64_t chunk = 0; chunk < checked_.size(); ++chunk)
    if (!checked_[chunk] && !verify(chunk, scratch_.data())) return false;
  return true;
}

}  // namespace fulgor::detail
