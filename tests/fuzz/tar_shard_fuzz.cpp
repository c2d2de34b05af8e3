// Tar shards, as fulgor-shard writes them and TarShards reads them.
//
// The input is a shard; where it holds "fulgor-tar-index" (an index's first
// line), the bytes from there on are the shard's index file (SHARD.idx) and
// the bytes before it the shard. A shard taken with its index must read back
// each sample as the bytes the index names; a shard taken by a scan of its
// headers must read back the same samples with the index write_index writes
// for it, each the bytes at the offset that index names.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/data/tar_shards.h"
#include "fuzz.h"

namespace fulgor::fuzz {
namespace {

namespace fs = std::filesystem;

struct IndexLine {
  uint64_t offset = 0, size = 0;
  int64_t target = 0;
  std::string member;
};

// An index's sample lines, read as TarShards reads them (after the shard took it).
std::vector<IndexLine> index_lines(const std::string& index, size_t count) {
  std::istringstream in(index);
  std::string magic;
  int version = 0;
  uint64_t bytes = 0, declared = 0;
  in >> magic >> version >> bytes >> declared;
  std::vector<IndexLine> lines(count);
  for (auto& line : lines) {
    in >> line.offset >> line.size >> line.target;
    in.get();
    std::getline(in, line.member);
  }
  require(static_cast<bool>(in), "an index taken has a line for each sample");
  return lines;
}

// Each sample of `shards` (one shard at `path`) reads back as the bytes `index` names.
void check_reads(const TarShards& shards, const std::string& path, const std::string& shard, const std::string& index) {
  require(shards.size() > 0 && shards.indexed(), "an indexed shard holds samples");
  const auto lines = index_lines(index, static_cast<size_t>(shards.size()));
  std::vector<uint8_t> bytes;
  for (int64_t i = 0; i < shards.size(); ++i) {
    const IndexLine& line = lines[static_cast<size_t>(i)];
    shards.read(i, bytes);  // within the shard, so never refused
    require(line.offset + line.size <= shard.size() &&
                std::string(bytes.begin(), bytes.end()) == shard.substr(line.offset, line.size),
            "a sample reads back as the bytes its index names");
    require(shards.target(i) == line.target && shards.name(i) == path + ":" + line.member,
            "a sample has its index's class and member");
    require(shards.target(i) >= 0 && shards.target(i) < static_cast<int64_t>(shards.classes().size()),
            "a sample's class is one of the classes");
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

}  // namespace

void tar_shard(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find("fulgor-tar-index");
  const std::string shard = input.substr(0, split);
  const std::string path =
      (fs::temp_directory_path() / ("fulgor_fuzz_" + std::to_string(::getpid()) + ".tar")).string();
  const std::string index_path = path + ".idx";
  write_file(path, shard);
  fs::remove(index_path);
  if (split != std::string::npos) {
    const std::string index = input.substr(split);
    write_file(index_path, index);
    try {
      const TarShards with_index({path});
      if (with_index.indexed()) check_reads(with_index, path, shard, index);
    } catch (const Error&) {
    }
    fs::remove(index_path);
  }
  std::optional<TarShards> scanned;
  try {
    scanned.emplace(std::vector<std::string>{path}, false);
  } catch (const Error&) {
  }
  if (scanned) {
    require(!scanned->indexed() && scanned->streams() == std::vector<int64_t>{scanned->size()},
            "a scanned shard is streamed");
    // The scan and the index it writes agree: the same samples, each the
    // bytes at the offset the index names.
    TarShards::write_index(path);
    const TarShards indexed({path});
    check_reads(indexed, path, shard, read_text(index_path));
    std::vector<uint8_t> a, b;
    for (int64_t i = 0; i < scanned->size(); ++i) {
      scanned->read(i, a);
      indexed.read(i, b);
      require(a == b && scanned->name(i) == indexed.name(i) && scanned->target(i) == indexed.target(i),
              "a scan and its index give the same samples");
    }
    require(scanned->classes() == indexed.classes(), "a scan and its index give the same classes");
  }
  fs::remove(index_path);
  fs::remove(path);
}

}  // namespace fulgor::fuzz

FULGOR_FUZZ_TARGET(fulgor::fuzz::tar_shard)
