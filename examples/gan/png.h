#pragma once

// A minimal PNG writer: 8-bit grayscale, one IDAT chunk, compressed with zlib.
// Enough for a grid of generated samples; no dependency beyond zlib.
//
// The file is written beside its name as ".NAME.tmp.XXXXXX" and renamed over
// NAME once complete, so a reader (an image viewer refreshing the grid while
// training runs) never sees half a file.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace png {

namespace detail {

inline void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

// Length, type, data, and the CRC-32 of type and data.
inline void put_chunk(std::vector<uint8_t>& out, const char type[4], const std::vector<uint8_t>& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), out.data() + type_at, static_cast<uInt>(4 + data.size()));
  put_u32(out, static_cast<uint32_t>(crc));
}

inline std::runtime_error write_error(const std::string& what, const std::string& path) {
  return std::runtime_error("cannot write " + path + ": " + what +
                            (errno != 0 ? std::string(": ") + std::strerror(errno) : ""));
}

}  // namespace detail

/// The PNG file's bytes for a `width` x `height` 8-bit grayscale image whose
/// rows (`width` bytes each, top to bottom) follow one another in `pixels`.
inline std::vector<uint8_t> encode_gray(const uint8_t* pixels, uint32_t width, uint32_t height) {
  if (width == 0 || height == 0 || width > 0x7fffffffu || height > 0x7fffffffu)
    throw std::invalid_argument("png: image size " + std::to_string(width) + "x" + std::to_string(height) +
                                " is not between 1 and 2^31-1 on each side");
  // Each scanline starts with its filter type: 0, none.
  std::vector<uint8_t> raw;
  raw.reserve(size_t(height) * (size_t(width) + 1));
  for (uint32_t y = 0; y < height; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), pixels + size_t(y) * width, pixels + size_t(y + 1) * width);
  }
  uLongf compressed_size = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> idat(compressed_size);
  if (compress2(idat.data(), &compressed_size, raw.data(), static_cast<uLong>(raw.size()), Z_BEST_COMPRESSION) != Z_OK)
    throw std::runtime_error("png: zlib could not compress the image");
  idat.resize(compressed_size);

  std::vector<uint8_t> ihdr;
  detail::put_u32(ihdr, width);
  detail::put_u32(ihdr, height);
  // Bit depth 8, colour type 0 (grayscale), compression 0 (deflate),
  // filter method 0, no interlace.
  ihdr.insert(ihdr.end(), {8, 0, 0, 0, 0});

  std::vector<uint8_t> file = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  detail::put_chunk(file, "IHDR", ihdr);
  detail::put_chunk(file, "IDAT", idat);
  detail::put_chunk(file, "IEND", {});
  return file;
}

/// Writes encode_gray's file to `path`, creating its folder, atomically (see
/// the top of this file). Throws std::runtime_error naming `path` when it
/// cannot be written.
inline void write_gray(const std::string& path, const uint8_t* pixels, uint32_t width, uint32_t height) {
  const std::vector<uint8_t> bytes = encode_gray(pixels, width, height);
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error("cannot write " + path + ": cannot create folder " + dir.string() + ": " + ec.message());
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  errno = 0;
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) throw detail::write_error("cannot create a temporary file in " + dir.string(), path);
  try {
    for (size_t done = 0; done < bytes.size();) {
      errno = 0;
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw detail::write_error("write", path);
      done += static_cast<size_t>(n);
    }
    // mkstemp makes the file readable by its owner alone; an image is an ordinary file.
    ::fchmod(fd, 0644);
    if (::fsync(fd) != 0) throw detail::write_error("fsync", path);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const auto error = detail::write_error("close", path);
    ::unlink(tmp.c_str());
    throw error;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const auto error = detail::write_error("rename", path);
    ::unlink(tmp.c_str());
    throw error;
  }
}

}  // namespace png
