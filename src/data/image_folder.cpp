#include "fulgor/data/image_folder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>

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

// torchvision's make_dataset for one class: sorted(os.walk(folder,
// followlinks=True)), each folder's files sorted, as paths joined with "/".
std::vector<std::string> class_files(const std::string& folder) {
  std::vector<std::pair<std::string, std::vector<std::string>>> walked;
  std::vector<std::string> pending{folder};
  while (!pending.empty()) {
    const std::string dir = std::move(pending.back());
    pending.pop_back();
    std::vector<std::string> files;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string path = dir + "/" + it->path().filename().string();
      std::error_code kind;
      if (fs::is_directory(it->path(), kind))
        pending.push_back(path);
      else
        files.push_back(it->path().filename().string());
    }
    std::sort(files.begin(), files.end());
    walked.emplace_back(dir, std::move(files));
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
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw DataError(fmt::format("{}: cannot be read ({})", path, std::strerror(errno)));
  bytes.clear();
  uint8_t chunk[1 << 16];
  size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof chunk, file.get())) > 0) bytes.insert(bytes.end(), chunk, chunk + got);
  if (std::ferror(file.get())) throw DataError(fmt::format("{}: read failed ({})", path, std::strerror(errno)));
}

}  // namespace fulgor
