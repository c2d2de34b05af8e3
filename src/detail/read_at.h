#pragma once
// Positioned reads of a whole block, for the files fulgor reads in pieces
// (checkpoints, tar shards).

#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace fulgor::detail {

/// Reads `size` bytes at `offset` of `fd`, retrying interrupted and short
/// reads. False at the file's end (errno 0) or on an error (errno set).
inline bool read_at(int fd, uint64_t offset, void* out, uint64_t size) {
  auto* at = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, at, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = 0;  // the file ends early
    if (n <= 0) return false;
    at += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
  return true;
}

}  // namespace fulgor::detail
