#include "fulgor/data/tar_shards.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "detail/read_at.h"
#include "detail/regular_file.h"
#include "fulgor/data/image_decode.h"

namespace fulgor {
namespace {

// A shard, opened once (Note [Shards kept open], Note [Opening a user's path]).
detail::RegularFile open_shard(const std::string& path) { return detail::open_regular<DataError>(path, "tar shard"); }

// Note [Tar numbers]
// A header's numeric field: octal digits, between spaces and up to a NUL, as
// tar and Python's tarfile write and read them, or base-256 (GNU's, for sizes
// of 8 GiB and more; a first byte of 0x80). Anything else is no number:
// neither a digit skipped (a field "-1" read as 1) nor a base-256 value of
// 2^64 or more wrapped round to a small one, which would read a member at
// another size than every other tar reader.
std::optional<uint64_t> tar_number(const char* field, size_t width) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(field);
  if (bytes[0] & 0x80) {
    if (bytes[0] != 0x80) return std::nullopt;  // 0xff: a negative number
    uint64_t v = 0;
    for (size_t i = 1; i < width; ++i) {
      if (v >> 56) return std::nullopt;
      v = (v << 8) | bytes[i];
    }
    return v;
  }
  const size_t end = strnlen(field, width);
  size_t i = 0;
  while (i < end && field[i] == ' ') ++i;
  uint64_t v = 0;  // at most 12 digits: below 2^36
  for (; i < end && field[i] >= '0' && field[i] <= '7'; ++i) v = v * 8 + static_cast<uint64_t>(field[i] - '0');
  while (i < end && field[i] == ' ') ++i;
  if (i != end) return std::nullopt;
  return v;
}

// A member's size, from its header at `offset`.
uint64_t member_size(const char* header, const std::string& path, const std::string& name, uint64_t offset) {
  if (const std::optional<uint64_t> size = tar_number(header + 124, 12)) return *size;
  const auto* field = reinterpret_cast<const unsigned char*>(header + 124);
  throw DataError(fmt::format("tar shard '{}': member '{}' (header at byte {}) has the size field {:02x}, not a tar "
                              "number (octal digits, or base-256 below 2^64)",
                              path, name, offset, fmt::join(field, field + 12, " ")));
}

std::string tar_text(const char* field, size_t width) { return std::string(field, strnlen(field, width)); }

// A pax extended header's path record, if any ("LEN path=VALUE\n").
std::optional<std::string> pax_path(const std::string& records) {
  size_t at = 0;
  while (at < records.size()) {
    const size_t space = records.find(' ', at);
    if (space == std::string::npos) break;
    const size_t length = std::strtoull(records.c_str() + at, nullptr, 10);
    if (length < space - at + 2 || length > records.size() - at) break;
    const std::string record = records.substr(space + 1, at + length - space - 2);
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    at += length;
  }
  return std::nullopt;
}

uint64_t size_of(int fd, const std::string& path) {
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    throw DataError(fmt::format("tar shard '{}' cannot be read ({})", path, std::strerror(errno)));
  return static_cast<uint64_t>(info.st_size);
}

constexpr const char* kIndexMagic = "fulgor-tar-index";

// A shard's index file, nullopt where there is none. Opened as a shard is
// (a FIFO would block the open, a link to /dev/zero never end), and no
// larger than its shard plus its first line: each sample's line is shorter
// than the sample's headers and member names in the shard.
std::optional<std::string> read_index(const std::string& path, uint64_t shard_size) {
  const detail::RegularFile file = detail::RegularFile::open(path);
  if (!file && (file.error() == ENOENT || file.error() == ENOTDIR)) return std::nullopt;
  if (!file) throw DataError(fmt::format("index '{}' {}", path, file.problem()));
  if (file.size() > shard_size + 4096)
    throw DataError(fmt::format("index '{}' has {} bytes, more than its shard's {} bytes: it is no index of it", path,
                                file.size(), shard_size));
  std::string text(static_cast<size_t>(file.size()), '\0');
  if (!detail::read_at(file.fd(), 0, text.data(), text.size()))
    throw DataError(fmt::format("index '{}' cannot be read", path));
  return text;
}

// Note [Shards from elsewhere]
// A shard's headers declare sizes up to 2^64 - 1 and a .cls member any
// number: each is checked against the file's size or a fixed limit before
// anything is allocated for it. Class indices stay below a million (the
// loader keeps one name per class, and ImageNet-21k has 21841); a pax record,
// a long name or a .cls member is at most 1 MiB.
constexpr int64_t kMaxClasses = 1'000'000;
constexpr uint64_t kMaxTextMember = uint64_t{1} << 20;

// A .cls member's class index: digits (and the line's end), below kMaxClasses.
int64_t class_index(const std::string& content, const std::string& what) {
  const char* first = content.data();
  const char* last = first + content.size();
  while (last != first && (last[-1] == '\n' || last[-1] == '\r' || last[-1] == ' ')) --last;
  int64_t v = -1;
  const auto [end, error] = std::from_chars(first, last, v);
  if (first == last || error != std::errc() || end != last || v < 0 || v >= kMaxClasses)
    throw DataError(fmt::format("{} holds '{}', not a class index (an integer from 0 to {})", what,
                                content.substr(0, 40), kMaxClasses - 1));
  return v;
}

// WebDataset's base_plus_ext: the key is the path up to the first dot of its file name.
std::pair<std::string, std::string> key_and_extension(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) return {path, ""};
  std::string ext = path.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return {path.substr(0, dot), ext};
}

// A member's header: its name (a preceding long name's, if any), size, type
// and where its data begins.
struct TarMember {
  std::string name;
  uint64_t size, data;
  char type;
};

// The member whose header is at `offset`, or nullopt at the archive's end.
std::optional<TarMember> read_member(int fd, uint64_t offset, const std::string& path, uint64_t file_size,
                                     std::optional<std::string>& long_name) {
  char header[512];
  // Archives end with zero blocks: one cut at a member's end lacks them.
  if (!detail::read_at(fd, offset, header, 512))
    throw DataError(fmt::format("tar shard '{}' is truncated: it ends at byte {} without the end-of-archive blocks",
                                path, file_size));
  if (std::all_of(header, header + 512, [](char c) { return c == 0; })) return std::nullopt;  // the archive's end
  if (std::memcmp(header + 257, "ustar", 5) != 0)
    throw DataError(fmt::format("tar shard '{}': not a tar archive (no ustar header at byte {})", path, offset));
  std::string name = tar_text(header + 345, 155);
  name = (name.empty() ? "" : name + "/") + tar_text(header, 100);
  if (long_name) name = *std::exchange(long_name, std::nullopt);
  const uint64_t size = member_size(header, path, name, offset), data = offset + 512;
  if (size > file_size || data + (size + 511) / 512 * 512 > file_size)
    throw DataError(fmt::format("tar shard '{}': member '{}' is truncated ({} of its {} bytes)", path, name,
                                file_size - std::min(file_size, data), size));
  return TarMember{std::move(name), size, data, header[156]};
}

// A member read whole: a long name, a pax header or a class index.
std::string read_text_member(int fd, const TarMember& member, const std::string& path) {
  if (member.size > kMaxTextMember)
    throw DataError(
        fmt::format("tar shard '{}': member '{}' has {} bytes; fulgor reads names and class indices "
                    "of up to {} bytes",
                    path, member.name, member.size, kMaxTextMember));
  std::string content(member.size, '\0');
  if (!detail::read_at(fd, member.data, content.data(), member.size))
    throw DataError(fmt::format("tar shard '{}': member '{}' cannot be read", path, member.name));
  return content;
}

}  // namespace

// Note [Shards kept open]
// A sample's read is one pread of its member at the offset the scan found,
// on a descriptor opened once: no open, seek and close per sample (which cost
// more than the read itself for small images), no shared file position, so
// the workers read concurrently without a lock.
struct TarShards::Files {
  std::vector<detail::RegularFile> shards;
};

std::vector<std::string> TarShards::expand(const std::string& pattern) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) return {pattern};
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos)
    throw ConfigError(fmt::format("shard pattern '{}' has a '{{' without its '}}'", pattern));
  const std::string inside = pattern.substr(open + 1, close - open - 1), head = pattern.substr(0, open);
  std::vector<std::string> choices;
  if (const size_t dots = inside.find(".."); dots != std::string::npos) {
    const std::string from = inside.substr(0, dots), to = inside.substr(dots + 2);
    char* end1 = nullptr;
    char* end2 = nullptr;
    const long long a = std::strtoll(from.c_str(), &end1, 10), b = std::strtoll(to.c_str(), &end2, 10);
    if (from.empty() || to.empty() || *end1 || *end2 || a > b)
      throw ConfigError(fmt::format("shard pattern '{}': {{{}}} is not a range FIRST..LAST of integers, FIRST <= LAST",
                                    pattern, inside));
    for (long long i = a; i <= b; ++i) choices.push_back(fmt::format("{:0{}d}", i, from.size()));
  } else {
    size_t at = 0;
    for (size_t comma; (comma = inside.find(',', at)) != std::string::npos; at = comma + 1)
      choices.push_back(inside.substr(at, comma - at));
    choices.push_back(inside.substr(at));
  }
  std::vector<std::string> paths;
  for (const auto& choice : choices)
    for (auto& rest : expand(pattern.substr(close + 1))) paths.push_back(head + choice + rest);
  return paths;
}

TarShards::TarShards(const std::vector<std::string>& shards, bool use_index) {
  for (const auto& pattern : shards)
    for (auto& path : expand(pattern)) shards_.push_back(std::move(path));
  if (shards_.empty()) throw ConfigError("TarShards needs at least one shard");
  files_ = std::make_shared<Files>();
  for (size_t s = 0; s < shards_.size(); ++s) {
    files_->shards.push_back(open_shard(shards_[s]));
    const size_t before = samples_.size();
    if (!use_index || !load_index(s)) {
      indexed_ = false;
      scan(s);
    }
    counts_.push_back(static_cast<int64_t>(samples_.size() - before));
  }
  if (samples_.empty())
    throw DataError(fmt::format("the tar shards {} hold no samples (an image member and a .cls member each)",
                                fmt::join(shards_, ", ")));
  // Streamed shards are read in order (Note [Streamed shards]), where the
  // kernel's larger read-ahead helps.
  if (!indexed_)
    for (const auto& file : files_->shards) ::posix_fadvise(file.fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
  int64_t classes = 0;
  for (const auto& sample : samples_) classes = std::max(classes, sample.target + 1);
  for (int64_t c = 0; c < classes; ++c) classes_.push_back(std::to_string(c));
}

// Note [Reading a shard's index]
// Only the 512-byte headers and the small .cls members are read; an image
// member's data is skipped, so indexing costs one read per member.
void TarShards::scan(size_t shard) {
  const std::string& path = shards_[shard];
  const int fd = files_->shards[shard].fd();
  const uint64_t file_size = size_of(fd, path);
  std::optional<std::string> long_name;
  std::optional<std::string> key;  // the sample's, once one has begun (an empty key is one, as WebDataset's)
  std::optional<Sample> image;
  std::optional<int64_t> target;
  auto finish = [&] {
    if (!key) return;
    if (!image)
      throw DataError(fmt::format("tar shard '{}': sample '{}' has no .jpg, .jpeg or .png member", path, *key));
    if (!target) throw DataError(fmt::format("tar shard '{}': sample '{}' has no .cls member", path, *key));
    image->target = *target;
    samples_.push_back(std::move(*image));
    image.reset();
    target.reset();
  };
  uint64_t offset = 0;
  while (const std::optional<TarMember> member = read_member(fd, offset, path, file_size, long_name)) {
    const auto [member_key, ext] = key_and_extension(member->name);
    const char type = member->type;
    const bool regular = type == '0' || type == '\0';
    const std::string content =
        type == 'L' || type == 'x' || (regular && ext == "cls") ? read_text_member(fd, *member, path) : "";
    if (type == 'L') long_name = tar_text(content.data(), content.size());
    if (type == 'x') long_name = pax_path(content);
    if (regular) {
      if (!key || member_key != *key) {
        finish();
        key = member_key;
      }
      if ((ext == "jpg" || ext == "jpeg" || ext == "png") && !image)
        image = Sample{shard, member->data, member->size, 0, member->name};
      if (ext == "cls") target = class_index(content, fmt::format("tar shard '{}': member '{}'", path, member->name));
    }
    offset = member->data + (member->size + 511) / 512 * 512;
  }
  finish();
}

// Note [A shard's index file]
// Text, so that a person or a script can read it: the shard's size in bytes
// (a shard rewritten since makes the index stale, and an error rather than
// wrong reads), then one line per sample. The member name comes last, as the
// rest of its line, since it may hold spaces.
bool TarShards::load_index(size_t shard) {
  const std::string path = shards_[shard] + ".idx";
  const uint64_t file_size = size_of(files_->shards[shard].fd(), shards_[shard]);
  const std::optional<std::string> text = read_index(path, file_size);
  if (!text) return false;
  std::istringstream in(*text);
  std::string magic;
  int version = 0;
  uint64_t bytes = 0;
  size_t count = 0;
  in >> magic >> version >> bytes >> count;
  if (!in || magic != kIndexMagic || version != 1)
    throw DataError(fmt::format("'{}' is not a tar shard index: its first line is not '{} 1 SHARD_BYTES SAMPLES'", path,
                                kIndexMagic));
  if (bytes != file_size)
    throw DataError(
        fmt::format("index '{}' was written for a shard of {} bytes, '{}' has {}: write it again "
                    "(fulgor-shard, TarShards::write_index) or remove it",
                    path, bytes, shards_[shard], file_size));
  for (size_t i = 0; i < count; ++i) {
    Sample sample{shard, 0, 0, 0, ""};
    in >> sample.offset >> sample.size >> sample.target;
    in.get();
    std::getline(in, sample.member);
    if (!in || sample.member.empty() || sample.target < 0 || sample.target >= kMaxClasses ||
        sample.size > file_size || sample.offset > file_size - sample.size)
      throw DataError(fmt::format("index '{}', line {}: not 'OFFSET SIZE CLASS MEMBER' within the shard's {} bytes",
                                  path, i + 2, file_size));
    samples_.push_back(std::move(sample));
  }
  return true;
}

std::string TarShards::write_index(const std::string& shard) {
  const TarShards scanned({shard}, false);
  const std::string path = shard + ".idx", partial = path + ".partial";
  {
    std::ofstream out(partial);
    out << fmt::format("{} 1 {} {}\n", kIndexMagic, size_of(scanned.files_->shards[0].fd(), shard),
                       scanned.samples_.size());
    for (const Sample& s : scanned.samples_) out << fmt::format("{} {} {} {}\n", s.offset, s.size, s.target, s.member);
    if (!out.flush()) throw DataError(fmt::format("index '{}' cannot be written", partial));
  }
  std::filesystem::rename(partial, path);
  return path;
}

std::vector<int64_t> TarShards::streams() const { return indexed_ ? std::vector<int64_t>{} : counts_; }

void TarShards::read(int64_t index, std::vector<uint8_t>& bytes) const {
  const Sample& s = samples_[static_cast<size_t>(index)];
  bytes.resize(s.size);
  if (!detail::read_at(files_->shards[s.shard].fd(), s.offset, bytes.data(), s.size))
    throw DataError(
        fmt::format("{}: cannot be read ({})", name(index), errno ? std::strerror(errno) : "it ends early"));
}

std::string TarShards::name(int64_t index) const {
  const Sample& s = samples_[static_cast<size_t>(index)];
  return shards_[s.shard] + ":" + s.member;
}

}  // namespace fulgor
