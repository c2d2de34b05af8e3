#include "fulgor/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/version.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "fulgor/error.h"
#include "fulgor/module.h"
#include "json_input.h"

namespace fulgor {
namespace {

constexpr char kMagic[8] = {'F', 'U', 'L', 'G', 'O', 'R', 'C', 'K'};
constexpr uint32_t kContainerVersion = 2;
constexpr size_t kHeaderSize = 28;

template <typename T>
void put_le(char* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

template <typename T>
T get_le(const char* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<unsigned char>(in[i])) << (8 * i);
  return value;
}

// FNV-1a over little-endian 64-bit words (the last one zero-padded): a word
// at a time it checks a 40 MB archive in a few milliseconds, where the
// byte-wise FNV-1a took tens. Fed in pieces of any size.
class Checksum {
 public:
  void update(const char* data, size_t size) {
    while (size > 0 && pending_ > 0) {
      word_[pending_++] = *data++;
      --size;
      if (pending_ == 8) mix(word_), pending_ = 0;
    }
    for (; size >= 8; data += 8, size -= 8) mix(data);
    for (; size > 0; --size) word_[pending_++] = *data++;
  }
  uint64_t finish() {
    if (pending_ > 0) {
      std::memset(word_ + pending_, 0, 8 - pending_);
      mix(word_);
      pending_ = 0;
    }
    return hash_;
  }

 private:
  void mix(const char* word) {
    hash_ ^= get_le<uint64_t>(word);
    hash_ *= 1099511628211ULL;
  }
  uint64_t hash_ = 1469598103934665603ULL;
  char word_[8] = {};
  size_t pending_ = 0;
};

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

// Streams the archive into the file while hashing it, gathering the archive's
// many small records into large writes. Errors are kept, not thrown: the
// archive writer calls back through LibTorch's zip code, which is told of a
// failure by a short write.
class ArchiveSink {
 public:
  ArchiveSink(int fd, const std::string& path) : fd_(fd), path_(path) { buffer_.reserve(kBufferSize); }

  size_t write(const void* data, size_t size) {
    if (!error_.empty()) return 0;
    const char* bytes = static_cast<const char*>(data);
    checksum_.update(bytes, size);
    length_ += size;
    try {
      if (buffer_.size() + size > kBufferSize) flush();
      if (size >= kBufferSize)
        write_all(fd_, bytes, size, path_);
      else
        buffer_.append(bytes, size);
    } catch (const CheckpointError& e) {
      error_ = e.what();
      return 0;
    }
    return size;
  }
  void flush() {
    write_all(fd_, buffer_.data(), buffer_.size(), path_);
    buffer_.clear();
  }
  const std::string& error() const { return error_; }
  uint64_t length() const { return length_; }
  uint64_t hash() { return checksum_.finish(); }

 private:
  static constexpr size_t kBufferSize = 1 << 20;
  int fd_;
  const std::string& path_;
  std::string buffer_, error_;
  Checksum checksum_;
  uint64_t length_ = 0;
};

// Writes the archive after a header whose length and hash are filled in at the end.
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
  std::memcpy(header, kMagic, sizeof(kMagic));
  put_le<uint32_t>(header + 8, kContainerVersion);
  put_le<uint64_t>(header + 12, sink.length());
  put_le<uint64_t>(header + 20, sink.hash());
  if (::pwrite(fd, header, kHeaderSize, 0) != static_cast<ssize_t>(kHeaderSize))
    throw CheckpointError(system_error("write", path));
}

}  // namespace

void write_checkpoint_file(const std::string& path, torch::serialize::OutputArchive& archive) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw CheckpointError(
        fmt::format("cannot write checkpoint '{}': cannot create folder '{}': {}", path, dir.string(), ec.message()));
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw CheckpointError(system_error("creating a temporary file", path));
  try {
    write_container(fd, archive, path);
    if (::fsync(fd) != 0) throw CheckpointError(system_error("fsync", path));
    if (::close(fd) != 0) {
      fd = -1;
      throw CheckpointError(system_error("close", path));
    }
    fd = -1;
    // mkstemp creates the file readable by its owner only; a checkpoint is an ordinary file.
    ::chmod(tmp.c_str(), 0644);
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw CheckpointError(system_error("rename", path));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the folder's entry is.
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

namespace {
// A file mapped read-only: the archive is checked and parsed where the page
// cache holds it, without copying 40 MB into a buffer first.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw CheckpointError(fmt::format("cannot read checkpoint '{}': {}", path, std::strerror(errno)));
    struct stat info {};
    if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd);
      throw CheckpointError(fmt::format("cannot read checkpoint '{}': it is not a regular file", path));
    }
    size_ = static_cast<size_t>(info.st_size);
    if (size_ > 0) {
      void* data = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (data == MAP_FAILED) {
        ::close(fd);
        throw CheckpointError(fmt::format("cannot read checkpoint '{}': {}", path, std::strerror(errno)));
      }
      data_ = static_cast<const char*>(data);
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {data_ ? data_ : "", size_}; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};
}  // namespace

torch::serialize::InputArchive read_checkpoint_file(const std::string& path) {
  const MappedFile file(path);
  const std::string_view bytes = file.bytes();
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    if (bytes.size() < sizeof(kMagic) && std::string_view(kMagic, bytes.size()) == bytes)
      throw CheckpointError(
          fmt::format("checkpoint '{}' is truncated: {} bytes, not even a header", path, bytes.size()));
    throw CheckpointError(fmt::format("'{}' is not a fulgor checkpoint (it does not start with \"FULGORCK\")", path));
  }
  const auto version = get_le<uint32_t>(bytes.data() + 8);
  const auto length = get_le<uint64_t>(bytes.data() + 12);
  const auto hash = get_le<uint64_t>(bytes.data() + 20);
  if (version != kContainerVersion)
    throw CheckpointError(fmt::format("checkpoint '{}' has container version {}; this fulgor reads version {}", path,
                                      version, kContainerVersion));
  if (bytes.size() - kHeaderSize < length)
    throw CheckpointError(
        fmt::format("checkpoint '{}' is truncated: {} of {} bytes present", path, bytes.size() - kHeaderSize, length));
  if (bytes.size() - kHeaderSize > length)
    throw CheckpointError(fmt::format("checkpoint '{}' is corrupted: {} bytes past the end of its data", path,
                                      bytes.size() - kHeaderSize - length));
  Checksum checksum;
  checksum.update(bytes.data() + kHeaderSize, length);
  if (checksum.finish() != hash)
    throw CheckpointError(fmt::format("checkpoint '{}' is corrupted: its contents do not match its checksum", path));
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data() + kHeaderSize, length, torch::Device(torch::kCPU));
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("checkpoint '{}' cannot be read by LibTorch {}: {}", path, TORCH_VERSION,
                                      e.what_without_backtrace()));
  }
  return archive;
}

namespace {
nlohmann::json meta_of(torch::serialize::InputArchive& archive, const std::string& path) {
  c10::IValue meta;
  if (!archive.try_read("meta", meta) || !meta.isString())
    throw CheckpointError(fmt::format("checkpoint '{}' has no metadata entry", path));
  detail::JsonInput json = detail::read_json(meta.toStringRef());
  if (!json.error.empty())
    throw CheckpointError(fmt::format("checkpoint '{}' has malformed metadata: {}", path, json.error));
  if (!json.value.is_object()) throw CheckpointError(fmt::format("checkpoint '{}' has malformed metadata", path));
  return std::move(json.value);
}
}  // namespace

nlohmann::json read_checkpoint_meta(const std::string& path) {
  auto archive = read_checkpoint_file(path);
  return meta_of(archive, path);
}

namespace detail {
void load_module_state(torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& path) {
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& key, torch::Tensor& target, bool is_buffer) {
    torch::Tensor saved;
    bool found = false;
    try {
      found = archive.try_read(key, saved, is_buffer);
    } catch (const c10::Error&) {
      found = false;
    }
    if (!found)
      throw CheckpointError(fmt::format("checkpoint '{}' has no {} '{}' for {}", path,
                                        is_buffer ? "buffer" : "parameter", key, module.name()));
    if (saved.sizes() != target.sizes())
      throw CheckpointError(fmt::format("checkpoint '{}': {} '{}' has shape [{}], the module's has shape [{}]", path,
                                        is_buffer ? "buffer" : "parameter", key, fmt::join(saved.sizes(), ", "),
                                        fmt::join(target.sizes(), ", ")));
    // Copied into the existing tensor: it may live on any device, and
    // optimizers keep referring to it.
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
          fmt::format("checkpoint '{}' has no submodule '{}' of {}", path, child.key(), module.name()));
    load_module_state(*child.value(), child_archive, path);
  }
}
}  // namespace detail

void load_module_weights(ModuleBase& module, const std::string& path) {
  auto archive = read_checkpoint_file(path);
  meta_of(archive, path);
  torch::serialize::InputArchive model;
  if (!archive.try_read("model", model)) throw CheckpointError(fmt::format("checkpoint '{}' has no model state", path));
  detail::load_module_state(module, model, path);
}

}  // namespace fulgor
