#include "fulgor/data/image_folder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>

#include "detail/read_at.h"
#include "detail/regular_file.h"
#include "fulgor/data/image_decode.h"

namespace fulgor {
namespace {

namespace fs = std::filesystem;

bool has_image_extension(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& ext : ImageFolder::extensions())
    if (lower.size() >= ext.size() && lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0) return true;
  return false;
}

// Note [Folders from elsewhere]
// torchvision walks a class folder following symbolic links; a link back to
// a folder above it would walk forever, and a FIFO named x.jpg would block
// the first read forever. The walk keeps each folder's (device, inode) and
// those above it, refuses a link that leads back up, and keeps regular files
// only (following links to them): FIFOs, devices, sockets and links that lead
// nowhere (or to themselves) are no images.
using FileId = std::pair<dev_t, ino_t>;

// torchvision's make_dataset for one class: sorted(os.walk(folder,
// followlinks=True)), each folder's files sorted, as paths joined with "/".
std::vector<std::string> class_files(const std::string& folder) {
  std::vector<std::pair<std::string, std::vector<std::string>>> walked;
  struct Pending {
    std::string dir;
    std::vector<FileId> above;  // this folder and those above it
  };
  struct stat top {};
  if (::stat(folder.c_str(), &top) != 0) return {};
  std::vector<Pending> pending{{folder, {{top.st_dev, top.st_ino}}}};
  while (!pending.empty()) {
    const Pending current = std::move(pending.back());
    pending.pop_back();
    std::vector<std::string> files;
    std::error_code ec;
    for (fs::directory_iterator it(current.dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string path = current.dir + "/" + it->path().filename().string();
      struct stat info {};
      if (::stat(path.c_str(), &info) != 0) continue;  // a link to nowhere, or to itself
      if (S_ISDIR(info.st_mode)) {
        const FileId id{info.st_dev, info.st_ino};
        if (std::find(current.above.begin(), current.above.end(), id) != current.above.end())
          throw DataError(fmt::format("ImageFolder: '{}' leads back to a folder above it (a symbolic link loop)",
                                      path));
        Pending next{path, current.above};
        next.above.push_back(id);
        pending.push_back(std::move(next));
      } else if (S_ISREG(info.st_mode)) {
        files.push_back(it->path().filename().string());
      }
    }
    std::sort(files.begin(), files.end());
    walked.emplace_back(current.dir, std::move(files));
  }
  std::sort(walked.begin(), walked.end());
  std::vector<std::string> paths;
  for (const auto& [dir, files] : walked)
    for (const auto& file : files)
      if (has_image_extension(file)) paths.push_back(dir + "/" + file);
  return paths;
}

}  // namespace

const std::vector<std::string>& ImageFolder::extensions() {
  static const std::vector<std::string> list{".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
  return list;
}

ImageFolder::ImageFolder(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw DataError(fmt::format("ImageFolder: '{}' is not a folder (expected root/<class>/<image files>)", root));
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code kind;
    if (fs::is_directory(it->path(), kind)) classes_.push_back(it->path().filename().string());
  }
  std::sort(classes_.begin(), classes_.end());
  if (classes_.empty()) throw DataError(fmt::format("ImageFolder: couldn't find any class folder in '{}'", root));
  std::vector<std::string> empty;
  for (size_t c = 0; c < classes_.size(); ++c) {
    auto files = class_files(root + "/" + classes_[c]);
    if (files.empty()) empty.push_back(classes_[c]);
    for (auto& f : files) {
      paths_.push_back(std::move(f));
      targets_.push_back(static_cast<int64_t>(c));
    }
  }
  if (!empty.empty())
    throw DataError(
        fmt::format("ImageFolder: found no valid file for the classes {} in '{}'. Supported extensions "
                    "are: {}",
                    fmt::join(empty, ", "), root, fmt::join(extensions(), ", ")));
}

void ImageFolder::read(int64_t index, std::vector<uint8_t>& bytes) const { read_file(name(index), bytes); }

void read_file(const std::string& path, std::vector<uint8_t>& bytes) {
  // A FIFO is refused rather than waited on (Note [Folders from elsewhere],
  // Note [Opening a user's path]); a regular file's size is known up front.
  const detail::RegularFile file = detail::RegularFile::open(path);
  if (!file) throw DataError(fmt::format("image '{}' {}", path, file.problem()));
  bytes.resize(static_cast<size_t>(file.size()));
  if (!detail::read_at(file.fd(), 0, bytes.data(), bytes.size())) {
    const int error = errno;
    throw DataError(fmt::format("{}: read failed ({})", path, error != 0 ? std::strerror(error) : "it shrank"));
  }
}

}  // namespace fulgor
