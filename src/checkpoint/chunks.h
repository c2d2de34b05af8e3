#pragma once
// The checksums of a version-4 checkpoint file, chunk by chunk.
//
// Note [Checked chunks]
// Version 4 hashes the archive in chunks of 256 KiB, each with its own XXH3-64,
// listed after the archive; the header holds the XXH3-64 of that list. When
// LibTorch first asks for bytes of a chunk, the reader reads the chunk into
// LibTorch's buffer and hashes it there, while it is in the processor's
// cache, before returning: the file passes through memory once, as it does
// for torch::load, where one hash over the whole archive needed a pass of
// its own before LibTorch could be given any of it. LibTorch still never
// parses a byte that was not checked, and the chunks it did not read are
// checked before the archive is used.

#include <xxhash.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fulgor::detail {

constexpr uint64_t kChecksumChunk = uint64_t{1} << 18;

inline uint64_t chunk_count(uint64_t length) { return (length + kChecksumChunk - 1) / kChecksumChunk; }

// The container's integers are little-endian whatever the machine's order.
template <typename T>
void put_le(char* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

template <typename T>
T get_le(const char* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<unsigned char>(in[i])) << (8 * i);
  return value;
}

struct Xxh3StateDeleter {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
};

// Hashes a stream chunk by chunk; table() is the list the file ends with.
class ChunkHasher {
 public:
  ChunkHasher();
  void update(const char* bytes, size_t size);
  // The little-endian hashes of every chunk, the last one partial; call once.
  std::string table();

 private:
  std::unique_ptr<XXH3_state_t, Xxh3StateDeleter> state_;
  uint64_t in_chunk_ = 0;
  std::string table_;
};

// The archive in an open file, its bytes from `offset` on, whose chunks are
// checked against `table` before any of their bytes is returned. A read that
// reaches a chunk that does not match, or that the system cannot read, stops
// short before it, which LibTorch reports as an error; corrupted() and
// read_error() then say why.
class CheckedArchive {
 public:
  CheckedArchive(int fd, uint64_t offset, uint64_t length, std::string table);

  size_t read(uint64_t pos, void* buf, size_t size);
  // Checks every chunk not checked so far; false if one does not match or
  // cannot be read.
  bool check_rest();
  bool corrupted() const { return corrupted_; }
  // errno of a read the system refused, 0 if none.
  int read_error() const { return read_error_; }

 private:
  // Reads all of `chunk` into `into` and checks it.
  bool verify(uint64_t chunk, char* into);
  bool read_into(char* out, uint64_t from, uint64_t size);

  int fd_;
  uint64_t offset_, length_;
  std::string table_, scratch_;
  std::vector<bool> checked_;
  bool corrupted_ = false;
  int read_error_ = 0;
};

}  // namespace fulgor::detail
