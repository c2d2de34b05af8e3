#include "fulgor/interop/distributed_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <torch/types.h>

#include <map>
#include <memory>

#include "archive/zip_reader.h"
#include "detail/regular_file.h"
#include "fulgor/core/error.h"
#include "interop/dcp_metadata.h"
#include "interop/torch_load_archive.h"

namespace fulgor {
namespace {

using detail::DcpChunk;
using detail::DcpEntry;
using detail::DcpStorage;

// A dict key as Python's str() of it, which flatten_state_dict uses.
std::string key_text(const c10::IValue& key) {
  if (key.isString()) return key.toStringRef();
  if (key.isInt()) return std::to_string(key.toInt());
  if (key.isBool()) return key.toBool() ? "True" : "False";
  throw InteropError(fmt::format("a distributed checkpoint's dict keys are strings, ints or bools, not {}",
                                 key.tagKind()));
}

// A path's key: its parts joined with ".".
std::string joined(const std::vector<c10::IValue>& path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) out += '.';
    out += key_text(path[i]);
  }
  return out;
}

// Python's flatten_state_dict keeps walking a list that holds a tensor, a
// dict, or a list it would walk (_traverse.py, _is_terminal).
bool walks_list(const c10::IValue& value) {
  if (!value.isList()) return false;
  for (const auto& element : value.toListRef())
    if (element.isTensor() || element.isGenericDict() || walks_list(element)) return true;
  return false;
}

void flatten_into(const std::vector<c10::IValue>& path, const c10::IValue& value, DistributedStateDict& out) {
  if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      std::vector<c10::IValue> inner = path;
      inner.emplace_back(key_text(item.key()));
      flatten_into(inner, item.value(), out);
    }
  } else if (walks_list(value)) {
    const auto& list = value.toListRef();
    for (size_t i = 0; i < list.size(); ++i) {
      std::vector<c10::IValue> inner = path;
      inner.emplace_back(static_cast<int64_t>(i));
      flatten_into(inner, list[i], out);
    }
  } else {
    out.push_back(DistributedCheckpointEntry{path, value, std::nullopt});
  }
}

// Sets `value` at `path` in `root`, making dicts and lists on the way. The
// paths may come from a file: they must nest (no key both a value and a
// container), and a list index stays below `entries`, the number of values,
// so that no path makes a list longer than the state it comes from.
void place(c10::IValue& root, const std::vector<c10::IValue>& path, size_t at, const c10::IValue& value,
           int64_t entries, const std::string& fqn) {
  auto conflict = [&] {
    throw InteropError(fmt::format("the path of '{}' runs through a value of another key: the keys do not nest", fqn));
  };
  if (at == path.size()) {
    if (root.isList() || root.isGenericDict()) conflict();
    root = value;
    return;
  }
  const c10::IValue& key = path[at];
  if (key.isInt()) {
    if (root.isNone()) root = c10::impl::GenericList(c10::AnyType::get());
    if (!root.isList()) conflict();
    if (key.toInt() < 0 || key.toInt() >= entries)
      throw InteropError(fmt::format("the path of '{}' has the list index {}, outside the {} values of the state", fqn,
                                     key.toInt(), entries));
    auto list = root.toList();
    while (static_cast<int64_t>(list.size()) <= key.toInt()) list.push_back(c10::IValue());
    c10::IValue element = list.get(key.toInt());
    place(element, path, at + 1, value, entries, fqn);
    list.set(key.toInt(), element);
  } else {
    if (root.isNone()) root = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
    if (!root.isGenericDict()) conflict();
    auto dict = root.toGenericDict();
    auto found = dict.find(key);
    c10::IValue element = found == dict.end() ? c10::IValue() : found->value();
    place(element, path, at + 1, value, entries, fqn);
    dict.insert_or_assign(key, element);
  }
}

// The files of a checkpoint's folder, each opened and mapped once, in the
// byte ranges asked for (Note [A distributed checkpoint from elsewhere]).
class FolderReader {
 public:
  explicit FolderReader(std::filesystem::path folder) : folder_(std::move(folder)) {}

  detail::DcpMetadata metadata() const {
    auto file = detail::MappedFile::open(folder_ / ".metadata");
    return detail::read_dcp_metadata(file->data(), file->size(), fmt::format("'{}'", (folder_ / ".metadata").string()));
  }
  // torch.save's archive at `storage`: a tensor chunk or an object.
  c10::IValue archive(const DcpStorage& storage, const std::string& what) {
    const detail::RegularFile& file = open(storage.relative_path);
    if (storage.offset + storage.length > file.size())
      throw InteropError(fmt::format("'{}': {} lies at bytes {} to {}, past the end of its file of {} bytes",
                                     (folder_ / storage.relative_path).string(), what, storage.offset,
                                     storage.offset + storage.length, file.size()));
    std::string name = fmt::format("{} ({})", (folder_ / storage.relative_path).string(), what);
    return detail::torch_load_archive(detail::MappedFile::map(file, name, storage.offset, storage.length), {});
  }

 private:
  const detail::RegularFile& open(const std::string& relative) {
    auto found = files_.find(relative);
    if (found != files_.end()) return *found->second;
    std::filesystem::path path = folder_ / relative;
    struct stat info {};
    if (::lstat(path.c_str(), &info) == 0 && S_ISLNK(info.st_mode))
      throw InteropError(fmt::format("'{}' is a link; a checkpoint's files are read only from its own folder",
                                     path.string()));
    auto file = std::make_unique<detail::RegularFile>(detail::RegularFile::open(path.string()));
    if (!*file) throw InteropError(fmt::format("'{}' {}", path.string(), file->problem()));
    return *files_.emplace(relative, std::move(file)).first->second;
  }

  std::filesystem::path folder_;
  std::map<std::string, std::unique_ptr<detail::RegularFile>> files_;
};

// Copies into `target` (the box at `offsets` of the whole tensor) every
// overlap with the saved chunks; returns how many elements were copied.
int64_t fill_box(FolderReader& reader, const DcpEntry& entry, torch::Tensor& target,
                 const std::vector<int64_t>& offsets) {
  torch::NoGradGuard no_grad;
  int64_t copied = 0;
  for (const DcpChunk& chunk : entry.chunks) {
    std::vector<int64_t> begin(offsets.size()), length(offsets.size());
    bool meets = true;
    for (size_t d = 0; d < offsets.size() && meets; ++d) {
      begin[d] = std::max(offsets[d], chunk.offsets[d]);
      length[d] = std::min(offsets[d] + target.size(static_cast<int64_t>(d)), chunk.offsets[d] + chunk.sizes[d]) -
                  begin[d];
      meets = length[d] > 0;
    }
    if (!meets) continue;
    std::string what = fmt::format("the chunk of '{}' at ({})", entry.fqn, fmt::join(chunk.offsets, ", "));
    c10::IValue saved = reader.archive(chunk.storage, what);
    if (!saved.isTensor() || saved.toTensor().sizes().vec() != chunk.sizes ||
        saved.toTensor().scalar_type() != entry.dtype)
      throw InteropError(fmt::format("{} does not hold a {} tensor of ({}) as its metadata says", what,
                                     c10::toString(entry.dtype), fmt::join(chunk.sizes, ", ")));
    torch::Tensor from = saved.toTensor(), to = target;
    for (size_t d = 0; d < offsets.size(); ++d) {
      auto dim = static_cast<int64_t>(d);
      from = from.narrow(dim, begin[d] - chunk.offsets[d], length[d]);
      to = to.narrow(dim, begin[d] - offsets[d], length[d]);
    }
    to.copy_(from);
    copied += from.numel();
  }
  return copied;
}

void load_tensor(FolderReader& reader, const DcpEntry& saved, DistributedCheckpointEntry& entry,
                 const std::string& folder) {
  torch::Tensor target = entry.value.toTensor();
  std::vector<int64_t> size = entry.placement ? entry.placement->size : target.sizes().vec();
  std::vector<int64_t> offsets = entry.placement ? entry.placement->offsets : std::vector<int64_t>(size.size(), 0);
  if (!saved.is_tensor)
    throw InteropError(fmt::format("'{}' holds '{}' as an object, not a tensor", folder, saved.fqn));
  if (saved.size != size || saved.dtype != target.scalar_type())
    throw InteropError(fmt::format("'{}' holds '{}' as a {} tensor of ({}), not a {} tensor of ({})", folder,
                                   saved.fqn, c10::toString(saved.dtype), fmt::join(saved.size, ", "),
                                   c10::toString(target.scalar_type()), fmt::join(size, ", ")));
  if (offsets.size() != size.size() || target.dim() != static_cast<int64_t>(size.size()))
    throw InteropError(fmt::format("the placement of '{}' does not have its tensor's {} dimensions", saved.fqn,
                                   size.size()));
  int64_t copied = fill_box(reader, saved, target, offsets);
  if (copied != target.numel())
    throw InteropError(fmt::format("'{}' covers {} of the {} elements of '{}' asked for at ({})", folder, copied,
                                   target.numel(), saved.fqn, fmt::join(offsets, ", ")));
}

void load_entries(FolderReader& reader, const detail::DcpMetadata& metadata, DistributedStateDict& state,
                  const std::string& folder) {
  std::map<std::string, const DcpEntry*> by_name;
  for (const DcpEntry& entry : metadata.entries) by_name[entry.fqn] = &entry;
  for (auto& entry : state) {
    auto saved = by_name.find(entry.fqn());
    if (saved == by_name.end()) throw InteropError(fmt::format("'{}' has no '{}'", folder, entry.fqn()));
    if (entry.value.isTensor()) {
      load_tensor(reader, *saved->second, entry, folder);
    } else {
      if (saved->second->is_tensor)
        throw InteropError(fmt::format("'{}' holds '{}' as a tensor, where an object is asked for", folder,
                                       entry.fqn()));
      entry.value = reader.archive(saved->second->object, fmt::format("the object '{}'", entry.fqn()));
    }
  }
}

}  // namespace

std::string DistributedCheckpointEntry::fqn() const { return joined(path); }

DistributedStateDict flatten_state_dict(const c10::IValue& nested) {
  if (!nested.isGenericDict())
    throw InteropError(fmt::format("a distributed checkpoint saves a dict, not a {}", nested.tagKind()));
  DistributedStateDict out;
  flatten_into({}, nested, out);
  return out;
}

c10::IValue unflatten_state_dict(const DistributedStateDict& flat) {
  c10::IValue root = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& entry : flat) {
    if (entry.placement)
      throw InteropError(fmt::format("'{}' is a piece of a tensor, not a value of a nested state", entry.fqn()));
    place(root, entry.path, 0, entry.value, static_cast<int64_t>(flat.size()), entry.fqn());
  }
  return root;
}

void load_distributed_checkpoint(DistributedStateDict& state, const std::filesystem::path& folder) {
  FolderReader reader(folder);
  load_entries(reader, reader.metadata(), state, folder.string());
}

c10::IValue read_distributed_checkpoint(const std::filesystem::path& folder) {
  return detail::read_distributed_checkpoint_under(folder, "");
}

std::vector<std::string> detail::distributed_checkpoint_keys(const std::filesystem::path& folder) {
  std::vector<std::string> keys;
  for (const DcpEntry& entry : FolderReader(folder).metadata().entries) {
    const std::string key = entry.path.empty() || joined(entry.path) != entry.fqn ? entry.fqn : key_text(entry.path[0]);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  return keys;
}

c10::IValue detail::read_distributed_checkpoint_under(const std::filesystem::path& folder, const std::string& key) {
  FolderReader reader(folder);
  detail::DcpMetadata metadata = reader.metadata();
  DistributedStateDict state;
  for (const DcpEntry& entry : metadata.entries) {
    // A key without planner_data (no nesting recorded) stays one key.
    std::vector<c10::IValue> path = entry.path;
    if (path.empty() || joined(path) != entry.fqn) path = {c10::IValue(entry.fqn)};
    if (!key.empty() && !(path.size() > 1 && path[0].isString() && path[0].toStringRef() == key)) continue;
    c10::IValue value;
    if (entry.is_tensor) value = torch::empty(entry.size, torch::TensorOptions().dtype(entry.dtype));
    state.push_back(DistributedCheckpointEntry{path, value, std::nullopt});
  }
  load_entries(reader, metadata, state, folder.string());
  return unflatten_state_dict(state);
}

bool is_distributed_checkpoint(const std::filesystem::path& folder) {
  std::error_code error;
  return std::filesystem::is_directory(folder, error) &&
         std::filesystem::is_regular_file(folder / ".metadata", error);
}

}  // namespace fulgor
