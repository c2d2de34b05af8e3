#include "fulgor/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <torch/version.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <new>
#include <string_view>

#include "archive/script_archive.h"
#include "checkpoint/checkpoint_file.h"
#include "checkpoint/chunks.h"
#include "checkpoint/meta.h"
#include "detail/read_at.h"
#include "detail/regular_file.h"
#include "detail/same_file.h"
#include "detail/sync_folder.h"
#include "fulgor/core/error.h"
#include "fulgor/module.h"

namespace fulgor {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'F', 'U', 'L', 'G', 'O', 'R', 'C', 'K'};
constexpr uint32_t kContainerVersion = 4;
// Versions 2 and 3 hold one hash of the whole archive (fnv1a_words, XXH3-64)
// and no list of chunk hashes; such files are still read.
constexpr uint32_t kFnvContainerVersion = 2;
constexpr size_t kHeaderSize = 28;

using detail::get_le;
using detail::put_le;

// Version 2's hash: FNV-1a over little-endian 64-bit words, the last one
// zero-padded.
uint64_t fnv1a_words(const char* data, size_t size) {
  uint64_t hash = 1469598103934665603ULL;
  auto mix = [&](const char* word) {
    hash ^= get_le<uint64_t>(word);
    hash *= 1099511628211ULL;
  };
  for (; size >= 8; data += 8, size -= 8) mix(data);
  if (size > 0) {
    char last[8] = {};
    std::memcpy(last, data, size);
    mix(last);
  }
  return hash;
}

std::string system_error(const std::string& what, const std::string& path) {
  return fmt::format("cannot write checkpoint '{}': {} failed: {}", path, what, std::strerror(errno));
}

void write_all(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw CheckpointError(system_error("write", path));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Note [Failed writes inside the archive writer]
// The archive writer calls back through LibTorch's zip code, which must not
// hear of a failed write: told by a short write, PyTorchStreamWriter throws,
// and its destructor, run while that exception unwinds, writes the zip's end
// and throws again, which ends the process (SIGABRT), the temporary left
// behind. So the sink keeps the first error, takes and drops every later
// byte as if written, and write_container throws the kept error once
// LibTorch has returned.

// Streams the archive into the file while hashing it (Note [Checked chunks]),
// gathering the archive's many small records into large writes.
class ArchiveSink {
 public:
  ArchiveSink(int fd, const std::string& path) : fd_(fd), path_(path) { buffer_.reserve(kBufferSize); }

  size_t write(const void* data, size_t size) {
    if (!error_.empty()) return size;  // Note [Failed writes inside the archive writer]
    const char* bytes = static_cast<const char*>(data);
    hashes_.update(bytes, size);
    length_ += size;
    try {
      if (buffer_.size() + size > kBufferSize) flush();
      if (size >= kBufferSize)
        write_all(fd_, bytes, size, path_);
      else
        buffer_.append(bytes, size);
    } catch (const CheckpointError& e) {
      error_ = e.what();
    }
    return size;
  }
  void flush() {
    write_all(fd_, buffer_.data(), buffer_.size(), path_);
    buffer_.clear();
  }
  const std::string& error() const { return error_; }
  uint64_t length() const { return length_; }
  std::string hash_table() { return hashes_.table(); }

 private:
  static constexpr size_t kBufferSize = 1 << 20;
  int fd_;
  const std::string& path_;
  detail::ChunkHasher hashes_;
  std::string buffer_, error_;
  uint64_t length_ = 0;
};

// Writes the archive after a header whose length and hash are filled in at
// the end, and the chunks' hashes after it. Until then the header is zeros,
// which marks an unfinished temporary (is_unfinished_checkpoint).
void write_container(int fd, torch::serialize::OutputArchive& archive, const std::string& path) {
  char header[kHeaderSize] = {};
  write_all(fd, header, kHeaderSize, path);
  ArchiveSink sink(fd, path);
  try {
    archive.save_to([&](const void* data, size_t size) { return sink.write(data, size); });
  } catch (const c10::Error& e) {
    if (!sink.error().empty()) throw CheckpointError(sink.error());
    throw CheckpointError(fmt::format("cannot write checkpoint '{}': LibTorch could not serialise it: {}", path,
                                      e.what_without_backtrace()));
  }
  if (!sink.error().empty()) throw CheckpointError(sink.error());
  sink.flush();
  const std::string table = sink.hash_table();
  write_all(fd, table.data(), table.size(), path);
  std::memcpy(header, kMagic, sizeof(kMagic));
  put_le<uint32_t>(header + 8, kContainerVersion);
  put_le<uint64_t>(header + 12, sink.length());
  put_le<uint64_t>(header + 20, XXH3_64bits(table.data(), table.size()));
  if (::pwrite(fd, header, kHeaderSize, 0) != static_cast<ssize_t>(kHeaderSize))
    throw CheckpointError(system_error("write", path));
}

// Note [Temporary checkpoint files]
// A save writes ".NAME.tmp.XXXXXX" (mkstemp's six letters and digits) beside
// NAME and renames it over NAME once complete. A writer killed mid-save leaves
// its temporary behind, as large as the checkpoint it was writing;
// remove_stale_temporaries removes those. Several processes may save into one
// folder, so a temporary is stale only when no live writer owns it:
//  - the writer holds an flock on its temporary from just after creating it
//    until after the rename; the kernel drops the lock when the writer dies;
//  - the sweeper removes only temporaries it can lock without waiting.
// Between mkstemp and flock a temporary is unlocked, and a sweeper may remove
// it then; so the writer, once it holds the lock, checks that the name still
// leads to its file and starts over with a new name if not. The sweeper, once
// it holds the lock, checks the same: the name may have been renamed away,
// the writer's lock released with it. Where the file system has no flock,
// the writer writes unlocked and the sweeper, unable to lock, removes nothing.

int lock_exclusive(int fd, int flags) {
  int status;
  while ((status = ::flock(fd, LOCK_EX | flags)) != 0 && errno == EINTR) {
  }
  return status;
}

// Creates and locks the temporary that `path` is written to, in `dir`.
int create_temporary(const fs::path& dir, const std::string& path, std::string& tmp) {
  const std::string pattern = (dir / ("." + fs::path(path).filename().string() + ".tmp.XXXXXX")).string();
  // Losing the name to a sweeper takes the split second between mkstemp and
  // flock; losing it a hundred times in a row means something else is wrong.
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp = pattern;
    const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
    if (fd < 0) throw CheckpointError(system_error("creating a temporary file", path));
    lock_exclusive(fd, 0);
    if (detail::names_same_file(fd, tmp.c_str())) return fd;
    ::close(fd);
  }
  throw CheckpointError(
      fmt::format("cannot write checkpoint '{}': its temporary files in '{}' keep disappearing", path, dir.string()));
}

bool is_temporary_name(const std::string& name) {
  constexpr std::string_view suffix = ".tmp.";
  constexpr size_t random = 6;
  if (name.size() < 2 + suffix.size() + random || name[0] != '.') return false;
  const size_t at = name.size() - random - suffix.size();
  if (name.compare(at, suffix.size(), suffix) != 0) return false;
  return std::all_of(name.end() - random, name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; });
}

// A temporary that write_checkpoint_file made: a regular file that starts
// with the zeroed header (cut short anywhere) or, written to the end, with
// the finished one. Anything else of a similar name is not fulgor's to remove.
bool is_unfinished_checkpoint(int fd) {
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) return false;
  char head[kHeaderSize];
  const ssize_t n = ::pread(fd, head, kHeaderSize, 0);
  if (n < 0) return false;
  if (static_cast<size_t>(n) == kHeaderSize && std::memcmp(head, kMagic, sizeof(kMagic)) == 0) return true;
  return std::all_of(head, head + n, [](char c) { return c == 0; });
}

}  // namespace

void write_checkpoint_file(const std::string& path, torch::serialize::OutputArchive& archive) {
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // A rename would replace a FIFO or a device node with the checkpoint.
  if (const std::string problem = detail::output_problem(path); !problem.empty())
    throw CheckpointError(fmt::format("cannot write checkpoint '{}': it {}", path, problem));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw CheckpointError(
        fmt::format("cannot write checkpoint '{}': cannot create folder '{}': {}", path, dir.string(), ec.message()));
  std::string tmp;
  const int fd = create_temporary(dir, path, tmp);
  // The descriptor, and with it the lock, stays open until after the rename
  // (Note [Temporary checkpoint files]).
  try {
    write_container(fd, archive, path);
    // mkstemp creates the file readable by its owner only; a checkpoint is an ordinary file.
    ::fchmod(fd, 0644);
    if (::fsync(fd) != 0) throw CheckpointError(system_error("fsync", path));
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw CheckpointError(system_error("rename", path));
  } catch (...) {
    ::unlink(tmp.c_str());
    ::close(fd);
    throw;
  }
  // fsync has reported any error writing the data; nothing is left for close to report.
  ::close(fd);
  detail::sync_folder(dir);
}

namespace impl {
void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().string();
    if (!is_temporary_name(it->path().filename().string())) continue;
    // Non-blocking: opening a FIFO would otherwise wait for a writer.
    // Read-write: where flock is emulated with POSIX locks (NFS), an
    // exclusive lock needs a file open for writing.
    const int fd = ::open(name.c_str(), O_RDWR | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (is_unfinished_checkpoint(fd) && lock_exclusive(fd, LOCK_NB) == 0 && detail::names_same_file(fd, name.c_str()))
      ::unlink(name.c_str());
    ::close(fd);
  }
}
}  // namespace impl

namespace {
// A checkpoint file open for reading (Note [Opening a user's path]).
class CheckpointFile {
 public:
  CheckpointFile(const detail::RegularFile& file, const std::string& path) : path_(path), file_(file) {}

  const detail::RegularFile& file() const { return file_; }
  int fd() const { return file_.fd(); }
  uint64_t size() const { return file_.size(); }
  // `size` bytes at `offset`, which the file was found to hold.
  std::string read(uint64_t offset, uint64_t size) const {
    std::string bytes(size, '\0');
    if (detail::read_at(fd(), offset, bytes.data(), size)) return bytes;
    if (errno != 0) throw CheckpointError(fmt::format("cannot read checkpoint '{}': {}", path_, std::strerror(errno)));
    throw CheckpointError(fmt::format("checkpoint '{}' is truncated: it shrank while being read", path_));
  }

 private:
  const std::string& path_;
  const detail::RegularFile& file_;
};
// Note [Archives that hold no code]: what LibTorch would parse is checked
// first; `corrupted` says whether the file fails its checksums, the likelier
// reason for what the check refuses.
void check_holds_data(const CheckpointFile& file, const std::string& path, uint64_t length,
                      const std::function<void()>& corrupted) {
  try {
    detail::check_script_archive(detail::MappedFile::map(file.file(), path, kHeaderSize, length));
  } catch (const InteropError& e) {
    corrupted();
    throw CheckpointError(fmt::format("checkpoint {}", e.what()));
  }
}

struct ContainerHeader {
  uint32_t version;
  uint64_t length, hash;
  uint64_t expected;  // the bytes after the header: the archive, and the chunks' hashes
};

// The header, checked, and the file's size checked against it.
ContainerHeader read_header(const CheckpointFile& file, const std::string& path) {
  const std::string head = file.read(0, std::min<uint64_t>(file.size(), kHeaderSize));
  if (head.size() < kHeaderSize || std::memcmp(head.data(), kMagic, sizeof(kMagic)) != 0) {
    if (head.size() < sizeof(kMagic) && std::string_view(kMagic, head.size()) == head)
      throw CheckpointError(
          fmt::format("checkpoint '{}' is truncated: {} bytes, not even a header", path, head.size()));
    throw CheckpointError(fmt::format("'{}' is not a fulgor checkpoint (it does not start with \"FULGORCK\")", path));
  }
  ContainerHeader header{get_le<uint32_t>(head.data() + 8), get_le<uint64_t>(head.data() + 12),
                         get_le<uint64_t>(head.data() + 20), 0};
  if (header.version < kFnvContainerVersion || header.version > kContainerVersion)
    throw CheckpointError(fmt::format("checkpoint '{}' has container version {}; this fulgor reads versions {} to {}",
                                      path, header.version, kFnvContainerVersion, kContainerVersion));
  const uint64_t present = file.size() - kHeaderSize, length = header.length;
  // The length is compared with the file before the table's size is
  // computed from it, which then cannot overflow.
  const bool chunked = header.version == kContainerVersion;
  header.expected = chunked && length <= present ? length + 8 * detail::chunk_count(length) : length;
  if (present < header.expected)
    throw CheckpointError(
        fmt::format("checkpoint '{}' is truncated: {} of {} bytes present", path, present, header.expected));
  if (present > header.expected)
    throw CheckpointError(fmt::format("checkpoint '{}' is corrupted: {} bytes past the end of its data", path,
                                      present - header.expected));
  return header;
}

CheckpointError corrupted(const std::string& path) {
  return CheckpointError(fmt::format("checkpoint '{}' is corrupted: its contents do not match its checksum", path));
}

CheckpointError unreadable(const std::string& path, const std::string& why) {
  return CheckpointError(fmt::format("checkpoint '{}' cannot be read by LibTorch {}: {}", path, TORCH_VERSION, why));
}

// Versions 2 and 3: one hash over the whole archive, read into memory.
torch::serialize::InputArchive load_hashed_whole(const CheckpointFile& file, const std::string& path,
                                                 const ContainerHeader& header) {
  const uint64_t length = header.length;
  const std::string data = file.read(kHeaderSize, length);
  const uint64_t actual =
      header.version == kFnvContainerVersion ? fnv1a_words(data.data(), length) : XXH3_64bits(data.data(), length);
  if (actual != header.hash) throw corrupted(path);
  check_holds_data(file, path, length, [] {});
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(data.data(), length, torch::Device(torch::kCPU));
  } catch (const c10::Error& e) {
    throw unreadable(path, e.what_without_backtrace());
  }
  return archive;
}

// The current version: each chunk checked as LibTorch reads it (Note [Checked chunks]).
torch::serialize::InputArchive load_chunked(const CheckpointFile& file, const std::string& path,
                                            const ContainerHeader& header) {
  const uint64_t length = header.length;
  std::string table = file.read(kHeaderSize + length, header.expected - length);
  if (XXH3_64bits(table.data(), table.size()) != header.hash) throw corrupted(path);
  detail::CheckedArchive checked(file.fd(), kHeaderSize, length, std::move(table));
  auto check_rest = [&] {
    if (checked.check_rest()) return;
    if (checked.read_error() != 0)
      throw CheckpointError(fmt::format("cannot read checkpoint '{}': {}", path, std::strerror(checked.read_error())));
    throw corrupted(path);
  };
  check_holds_data(file, path, length, check_rest);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from([&](uint64_t pos, void* buf, size_t n) { return checked.read(pos, buf, n); },
                      [&] { return static_cast<size_t>(length); }, torch::Device(torch::kCPU));
  } catch (const c10::Error& e) {
    // A read stopped at a chunk that does not match: LibTorch names a symptom.
    check_rest();
    throw unreadable(path, e.what_without_backtrace());
  }
  check_rest();
  return archive;
}
}  // namespace

torch::serialize::InputArchive read_checkpoint_file(const std::string& path) {
  return detail::read_checkpoint_file(detail::open_regular<CheckpointError>(path, "checkpoint"), path);
}

torch::serialize::InputArchive detail::read_checkpoint_file(const RegularFile& opened, const std::string& path) {
  const CheckpointFile file(opened, path);
  const ContainerHeader header = read_header(file, path);
  return header.version == kContainerVersion ? load_chunked(file, path, header) : load_hashed_whole(file, path, header);
}

nlohmann::json read_checkpoint_meta(const std::string& path) {
  auto archive = read_checkpoint_file(path);
  return detail::parse_checkpoint_meta(archive, path);
}

namespace {
// Note [Checkpoint dtypes]
// A tensor is loaded only into one of its own dtype. LibTorch's copy_ would
// cast a float64 checkpoint into a float32 module silently, and the
// optimizer's state, which keeps the saved dtype, then fails inside LibTorch
// (an INTERNAL ASSERT in the first step). Casting the optimizer's state as
// well would resume a different run from the one saved, so a mismatch is a
// CheckpointError naming the tensor and both dtypes: the user converts the
// module (module.to(torch::kFloat64)) to the checkpoint's dtype, or loads the
// weights for another dtype explicitly.

// Note [Loading without a copy]
// A tensor is loaded into the module's existing one: optimizers and hooks
// keep referring to that tensor, which may live on any device. Where nothing
// else sees its memory, it takes the saved tensor's memory instead of a copy
// (as torch::load does), which spares a pass over all the weights. Where its
// memory is shared (a view, a flattened buffer, tied weights saved apart) or
// the saved memory is already someone's (a second load from one archive),
// the values are copied, so no two tensors come to share memory that did not.
bool can_take_storage(const torch::Tensor& target, const torch::Tensor& saved) {
  auto alone = [](const torch::Tensor& t) {
    return t.layout() == torch::kStrided && !t.is_view() && t.is_contiguous() && t.storage_offset() == 0 &&
           t.storage().nbytes() == t.nbytes() && t.storage().use_count() == 1;
  };
  return target.device() == saved.device() && alone(target) && alone(saved);
}

// `prefix` is the dotted name of `module` within the module loaded ("" or "fc1.").
void load_state(torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& path,
                const std::string& prefix) {
  auto load = [&](const std::string& key, torch::Tensor& target, bool is_buffer) {
    const char* kind = is_buffer ? "buffer" : "parameter";
    torch::Tensor saved;
    bool found = false;
    try {
      found = archive.try_read(key, saved, is_buffer);
    } catch (const c10::Error&) {
      found = false;
    }
    if (!found)
      throw CheckpointError(
          fmt::format("checkpoint '{}' has no {} '{}{}' for {}", path, kind, prefix, key, module.name()));
    if (saved.sizes() != target.sizes())
      throw CheckpointError(fmt::format("checkpoint '{}': {} '{}{}' has shape [{}], the module's has shape [{}]", path,
                                        kind, prefix, key, fmt::join(saved.sizes(), ", "),
                                        fmt::join(target.sizes(), ", ")));
    if (saved.scalar_type() != target.scalar_type())  // Note [Checkpoint dtypes]
      throw CheckpointError(fmt::format(
          "checkpoint '{}': {} '{}{}' is {}, the module's is {}; convert the module to {} before loading it", path,
          kind, prefix, key, c10::toString(saved.scalar_type()), c10::toString(target.scalar_type()),
          c10::toString(saved.scalar_type())));
    // Note [Loading without a copy]
    if (can_take_storage(target, saved))
      target.set_(saved);
    else
      target.copy_(saved);
  };
  // Module::save nests one archive per submodule; read them the same way.
  for (auto& item : module.named_parameters(/*recurse=*/false)) load(item.key(), item.value(), false);
  for (auto& item : module.named_buffers(/*recurse=*/false)) load(item.key(), item.value(), true);
  for (auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive child_archive;
    if (!archive.try_read(child.key(), child_archive))
      throw CheckpointError(
          fmt::format("checkpoint '{}' has no submodule '{}{}' of {}", path, prefix, child.key(), module.name()));
    load_state(*child.value(), child_archive, path, prefix + child.key() + ".");
  }
}
}  // namespace

namespace impl {
void load_module_state(torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& path) {
  torch::NoGradGuard no_grad;
  load_state(module, archive, path, "");
}
}  // namespace impl

void load_module_weights(ModuleBase& module, const std::string& path) {
  auto archive = read_checkpoint_file(path);
  detail::parse_checkpoint_meta(archive, path);
  torch::serialize::InputArchive model;
  if (!archive.try_read("model", model)) throw CheckpointError(fmt::format("checkpoint '{}' has no model state", path));
  detail::load_module_state(module, model, path);
}

}  // namespace fulgor
