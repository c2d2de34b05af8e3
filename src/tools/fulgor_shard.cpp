// fulgor-shard: writes an ImageFolder as WebDataset-style tar shards that
// fulgor::TarShards, WebDataset and Python's tarfile read.

#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "fulgor/data/image_decode.h"
#include "fulgor/data/image_folder.h"
#include "fulgor/data/tar_shards.h"

namespace {

const char* usage =
    "usage: fulgor-shard FOLDER OUTPUT_DIR [--shard-size MB] [--prefix NAME] [--no-index]\n"
    "Writes FOLDER (root/<class>/<images>, torchvision's ImageFolder) as OUTPUT_DIR/NAME-000000.tar, ...:\n"
    "each sample KEY.<image extension> and KEY.cls (its class index), shards of about MB megabytes\n"
    "(default 256), in the folder's order, each with its index NAME-000000.tar.idx (the samples'\n"
    "offsets, for reading them in any order) unless --no-index. Prints the brace pattern that reads them.\n";

// One ustar header block (POSIX.1-1988), as Python's tarfile reads it.
void write_header(std::ostream& out, const std::string& name, uint64_t size) {
  char h[512] = {};
  if (name.size() > 100) throw fulgor::ConfigError(fmt::format("member name '{}' is over 100 bytes", name));
  std::memcpy(h, name.data(), name.size());
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
  out.write(h, 512);
}

void write_member(std::ostream& out, const std::string& name, const uint8_t* data, uint64_t size) {
  write_header(out, name, size);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  static const char zeros[512] = {};
  out.write(zeros, static_cast<std::streamsize>((512 - size % 512) % 512));
}

std::string extension_of(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

int run(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  double shard_mb = 256;
  std::string prefix = "shard";
  bool index = true;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--no-index") {
      index = false;
    } else if ((args[i] == "--shard-size" || args[i] == "--prefix") && i + 1 < args.size()) {
      if (args[i] == "--prefix")
        prefix = args[++i];
      else
        shard_mb = std::stod(args[++i]);
    } else if (args[i] == "-h" || args[i] == "--help") {
      std::cout << usage;
      return 0;
    } else {
      positional.push_back(args[i]);
    }
  }
  if (positional.size() != 2 || !(shard_mb > 0)) {
    std::cerr << usage;
    return 2;
  }
  const fulgor::ImageFolder folder(positional[0]);
  std::filesystem::create_directories(positional[1]);
  const auto limit = static_cast<uint64_t>(shard_mb * 1024 * 1024);
  std::ofstream out;
  uint64_t written = 0;
  int64_t shards = 0;
  std::vector<std::string> paths;
  std::vector<uint8_t> bytes;
  for (int64_t i = 0; i < folder.size(); ++i) {
    if (!out.is_open() || written >= limit) {
      if (out.is_open()) out.write(std::string(1024, '\0').data(), 1024);
      paths.push_back(fmt::format("{}/{}-{:06d}.tar", positional[1], prefix, shards++));
      out = std::ofstream(paths.back(), std::ios::binary);
      written = 0;
    }
    folder.read(i, bytes);
    const std::string key = fmt::format("{:08d}", i), cls = std::to_string(folder.target(i));
    write_member(out, key + extension_of(folder.name(i)), bytes.data(), bytes.size());
    write_member(out, key + ".cls", reinterpret_cast<const uint8_t*>(cls.data()), cls.size());
    written += bytes.size() + cls.size() + 1024;
  }
  if (out.is_open()) out.write(std::string(1024, '\0').data(), 1024);
  out.close();
  if (index)
    for (const auto& path : paths) fulgor::TarShards::write_index(path);
  std::cout << fmt::format("{} samples in {} shards: {}/{}-{{000000..{:06d}}}.tar\n", folder.size(), shards,
                           positional[1], prefix, shards - 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << "fulgor-shard: " << e.what() << "\n";
    return 1;
  }
}
