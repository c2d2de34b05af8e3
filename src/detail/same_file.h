#pragma once

// Whether the name `path` still leads to the file open as `fd`: between an
// open and a lock, another process may have removed or renamed the name away
// (Note [Temporary checkpoint files], Note [Temporary checkpoint folders]).

#include <sys/stat.h>

namespace fulgor::detail {

inline bool names_same_file(int fd, const char* path) {
  struct stat opened {};
  struct stat named {};
  return ::fstat(fd, &opened) == 0 && ::lstat(path, &named) == 0 && opened.st_dev == named.st_dev &&
         opened.st_ino == named.st_ino;
}

}  // namespace fulgor::detail
