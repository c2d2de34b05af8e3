#include "fulgor/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <torch/version.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "fulgor/error.h"
#include "fulgor/module.h"

namespace fulgor {
namespace {

constexpr char kMagic[8] = {'F', 'U', 'L', 'G', 'O', 'R', 'C', 'K'};
constexpr uint32_t kContainerVersion = 1;
constexpr size_t kHeaderSize = 28;

uint64_t fnv1a(const char* data, size_t size) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < size; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ULL;
  }
  return h;
}

template <typename T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

template <typename T>
T get_le(const char* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<unsigned char>(in[i])) << (8 * i);
  return value;
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

}  // namespace

void write_checkpoint_file(const std::string& path, torch::serialize::OutputArchive& archive) {
  std::string payload;
  archive.save_to([&](const void* data, size_t size) {
    payload.append(static_cast<const char*>(data), size);
    return size;
  });
  std::string header(kMagic, sizeof(kMagic));
  put_le<uint32_t>(header, kContainerVersion);
  put_le<uint64_t>(header, payload.size());
  put_le<uint64_t>(header, fnv1a(payload.data(), payload.size()));

  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError(fmt::format("cannot write checkpoint '{}': cannot create folder '{}': {}", path,
                                            dir.string(), ec.message()));
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw CheckpointError(system_error("creating a temporary file", path));
  try {
    write_all(fd, header.data(), header.size(), path);
    write_all(fd, payload.data(), payload.size(), path);
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

torch::serialize::InputArchive read_checkpoint_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("cannot read checkpoint '{}': {}", path, std::strerror(errno)));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    if (bytes.size() < sizeof(kMagic) && std::string(kMagic, bytes.size()) == bytes)
      throw CheckpointError(fmt::format("checkpoint '{}' is truncated: {} bytes, not even a header", path, bytes.size()));
    throw CheckpointError(fmt::format("'{}' is not a fulgor checkpoint (it does not start with \"FULGORCK\")", path));
  }
  const auto version = get_le<uint32_t>(bytes.data() + 8);
  const auto length = get_le<uint64_t>(bytes.data() + 12);
  const auto hash = get_le<uint64_t>(bytes.data() + 20);
  if (version != kContainerVersion)
    throw CheckpointError(fmt::format("checkpoint '{}' has container version {}; this fulgor reads version {}", path,
                                      version, kContainerVersion));
  if (bytes.size() - kHeaderSize < length)
    throw CheckpointError(fmt::format("checkpoint '{}' is truncated: {} of {} bytes present", path,
                                      bytes.size() - kHeaderSize, length));
  if (bytes.size() - kHeaderSize > length)
    throw CheckpointError(fmt::format("checkpoint '{}' is corrupted: {} bytes past the end of its data", path,
                                      bytes.size() - kHeaderSize - length));
  if (fnv1a(bytes.data() + kHeaderSize, length) != hash)
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
  nlohmann::json json = nlohmann::json::parse(meta.toStringRef(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object())
    throw CheckpointError(fmt::format("checkpoint '{}' has malformed metadata", path));
  return json;
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
      throw CheckpointError(fmt::format("checkpoint '{}': {} '{}' has shape [{}], the module's has shape [{}]",
                                        path, is_buffer ? "buffer" : "parameter", key, fmt::join(saved.sizes(), ", "),
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
      throw CheckpointError(fmt::format("checkpoint '{}' has no submodule '{}' of {}", path, child.key(),
                                        module.name()));
    load_module_state(*child.value(), child_archive, path);
  }
}
}  // namespace detail

void load_module_weights(ModuleBase& module, const std::string& path) {
  auto archive = read_checkpoint_file(path);
  meta_of(archive, path);
  torch::serialize::InputArchive model;
  if (!archive.try_read("model", model))
    throw CheckpointError(fmt::format("checkpoint '{}' has no model state", path));
  detail::load_module_state(module, model, path);
}

}  // namespace fulgor
