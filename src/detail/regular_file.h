#pragma once
// Note [Opening a user's path]
// A path a user names (a checkpoint, a weights file, a config, an image, a
// shard) may be a FIFO, a device or a socket. open(2) of a FIFO waits for a
// writer, and a device reads on forever (/dev/zero) or never (/dev/tty). So
// such a path is opened non-blocking, which changes nothing for a regular
// file, its descriptor is fstat'ed and refused unless it is a regular file,
// and only then made blocking again. The descriptor checked is the one read:
// a file swapped for another between a check and an open cannot slip in.
// Header-only, for the tools that do not link the library's internals.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace fulgor::detail {

/// What a file of `mode` is, in words: "a FIFO", "a character device", ...
inline std::string file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "no regular file";
}

/// A regular file open for reading (Note [Opening a user's path]); closes its
/// descriptor when destroyed.
class RegularFile {
 public:
  /// Opens `path`. Where it cannot be opened or is no regular file the result
  /// is empty, and problem() says why in words that follow the path in a
  /// message: "cannot be opened: No such file or directory", "is a FIFO, not
  /// a regular file".
  static RegularFile open(const std::string& path) {
    RegularFile file;
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat info {};
    if (fd < 0) {
      file.error_ = errno;
      // A socket cannot be opened at all (ENXIO): say what it is rather than that.
      file.problem_ = ::stat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)
                          ? "is a socket, not a regular file"
                          : std::string("cannot be opened: ") + std::strerror(file.error_);
      return file;
    }
    if (::fstat(fd, &info) != 0) {
      file.error_ = errno;
      file.problem_ = std::string("cannot be read: ") + std::strerror(file.error_);
    } else if (!S_ISREG(info.st_mode)) {
      file.problem_ = "is " + file_kind(info.st_mode) + ", not a regular file";
    }
    if (!file.problem_.empty()) {
      ::close(fd);
      return file;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    file.fd_ = fd;
    file.size_ = static_cast<uint64_t>(info.st_size);
    return file;
  }

  RegularFile() = default;
  RegularFile(RegularFile&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)),
        size_(other.size_),
        problem_(std::move(other.problem_)),
        error_(other.error_) {}
  RegularFile& operator=(RegularFile&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(other.fd_, -1);
      size_ = other.size_;
      problem_ = std::move(other.problem_);
      error_ = other.error_;
    }
    return *this;
  }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  explicit operator bool() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  /// Its size when it was opened.
  uint64_t size() const { return size_; }
  const std::string& problem() const { return problem_; }
  /// The errno of a failed open, 0 otherwise.
  int error() const { return error_; }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string problem_;
  int error_ = 0;
};

/// RegularFile::open, throwing `E` ("checkpoint '/tmp/p' is a FIFO, not a
/// regular file") where it is empty; `what` names the file's role, if any.
template <class E>
RegularFile open_regular(const std::string& path, const std::string& what) {
  RegularFile file = RegularFile::open(path);
  if (!file) throw E((what.empty() ? "" : what + " ") + "'" + path + "' " + file.problem());
  return file;
}

/// Why `path` cannot be written as a file (created, or replaced by a rename):
/// "is a FIFO, not a regular file" where it exists and is no regular file
/// (following links), empty where it may be written.
inline std::string output_problem(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return "";
  return "is " + file_kind(info.st_mode) + ", not a regular file";
}

/// Throws `E` ("cannot write '/p': it is a FIFO, not a regular file; name a
/// file") where output_problem finds one.
template <class E>
void check_output(const std::string& path) {
  const std::string problem = output_problem(path);
  if (!problem.empty()) throw E("cannot write '" + path + "': it " + problem + "; name a file");
}

}  // namespace fulgor::detail
