#pragma once

// A rename or a new file is durable once its folder's entry is: the folder
// itself fsync'ed (best effort: a file system that cannot sync a folder has
// nothing more to offer).

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

namespace fulgor::detail {

inline void sync_folder(const std::filesystem::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace fulgor::detail
