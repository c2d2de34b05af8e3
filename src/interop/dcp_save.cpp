// save_distributed_checkpoint: Note [Saving a distributed checkpoint].
//
// Note [Saving a distributed checkpoint]
// As PyTorch's save does it (state_dict_saver.py: local plans, one global
// plan, each rank writing its part, rank 0 the metadata), in four steps:
//  1. plan: every rank lists what it holds (key, path, dtype, whole size,
//     the box of a tensor) and the plans are all-gathered, so every rank
//     computes the same global plan: the keys in order of first appearance,
//     each box and object written by one rank (a box several ranks hold by
//     the one with the fewest bytes so far, an object by its lowest holder),
//     and the whole checked before a byte is written (agreeing dtypes,
//     sizes and paths; boxes that do not overlap and cover each tensor);
//  2. write: rank 0 makes a temporary folder beside the checkpoint (Note
//     [Temporary checkpoint folders]) and broadcasts its name; each rank
//     writes its boxes and objects, each a torch.save archive, into
//     __<rank>_0.distcp there;
//  3. gather: each rank's storage entries (or its error) are all-gathered,
//     so that every rank fails alike when one did;
//  4. commit: rank 0 writes .metadata (through .metadata.tmp, as PyTorch
//     does), replaces the checkpoint's folder with the temporary one in one
//     rename (an exchange where one is already there, then removed) and
//     broadcasts the outcome.

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "detail/same_file.h"
#include "detail/sync_folder.h"
#include "fulgor/core/error.h"
#include "fulgor/distributed/process_group.h"
#include "fulgor/interop/distributed_checkpoint.h"
#include "interop/dcp_metadata.h"
#include "interop/torch_save_bytes.h"

namespace fulgor {
namespace {

using detail::DcpChunk;
using detail::DcpEntry;
using detail::DcpMetadata;
using nlohmann::json;

// What a rank holds of one key.
struct Offer {
  DcpEntry entry;                ///< one chunk for a tensor, none for an object
  int64_t bytes = 0;             ///< what writing it takes
  std::string archive;           ///< an object's torch.save archive (kept by its rank only)
  torch::Tensor tensor;          ///< a box's values (kept by its rank only)
};

json path_json(const std::vector<c10::IValue>& path) {
  json out = json::array();
  for (const auto& element : path) {
    if (element.isInt()) out.push_back(element.toInt());
    else out.push_back(element.toStringRef());
  }
  return out;
}

std::vector<c10::IValue> path_of(const json& value) {
  std::vector<c10::IValue> out;
  for (const auto& element : value) {
    if (element.is_number_integer()) out.emplace_back(element.get<int64_t>());
    else out.emplace_back(element.get<std::string>());
  }
  return out;
}

Offer offer_of(const DistributedCheckpointEntry& given) {
  Offer offer;
  offer.entry.fqn = given.fqn();
  offer.entry.path = given.path;
  if (!given.value.isTensor()) {
    offer.archive = detail::torch_save_bytes(given.value);
    offer.bytes = static_cast<int64_t>(offer.archive.size());
    return offer;
  }
  torch::Tensor tensor = given.value.toTensor().detach();
  offer.entry.is_tensor = true;
  offer.entry.dtype = tensor.scalar_type();
  offer.entry.size = given.placement ? given.placement->size : tensor.sizes().vec();
  std::vector<int64_t> offsets =
      given.placement ? given.placement->offsets : std::vector<int64_t>(offer.entry.size.size(), 0);
  if (offsets.size() != offer.entry.size.size() || tensor.dim() != static_cast<int64_t>(offsets.size()))
    throw InteropError(fmt::format("the placement of '{}' does not have its tensor's {} dimensions", offer.entry.fqn,
                                   tensor.dim()));
  offer.entry.chunks.push_back(DcpChunk{offsets, tensor.sizes().vec(), {}});
  offer.tensor = tensor;
  offer.bytes = static_cast<int64_t>(tensor.nbytes());
  return offer;
}

json offers_json(const std::vector<Offer>& offers) {
  json out = json::array();
  for (const Offer& offer : offers) {
    const DcpEntry& e = offer.entry;
    json item = {{"fqn", e.fqn}, {"path", path_json(e.path)}, {"tensor", e.is_tensor}, {"bytes", offer.bytes}};
    if (e.is_tensor) {
      item["dtype"] = static_cast<int>(e.dtype);
      item["size"] = e.size;
      item["offsets"] = e.chunks[0].offsets;
      item["sizes"] = e.chunks[0].sizes;
    }
    out.push_back(item);
  }
  return out;
}

// Every rank's text, in rank order (c10d gathers tensors of one shape: the
// lengths first).
std::vector<std::string> all_gather_text(ProcessGroup* group, const std::string& text) {
  if (group == nullptr) return {text};
  const auto on_device = torch::TensorOptions().device(group->device());
  torch::Tensor length = torch::full({1}, static_cast<int64_t>(text.size()), on_device.dtype(torch::kInt64));
  int64_t longest = 0;
  std::vector<int64_t> lengths;
  for (const auto& l : group->all_gather(length)) {
    lengths.push_back(l.cpu().item<int64_t>());
    longest = std::max(longest, lengths.back());
  }
  torch::Tensor bytes = torch::zeros({std::max<int64_t>(longest, 1)}, torch::kUInt8);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  std::vector<std::string> out;
  auto gathered = group->all_gather(bytes.to(group->device()));
  for (size_t r = 0; r < gathered.size(); ++r) {
    torch::Tensor received = gathered[r].cpu();
    const auto* data = received.data_ptr<uint8_t>();
    out.emplace_back(data, data + lengths[r]);
  }
  return out;
}

// The global plan (step 1): the metadata without storage, and who writes
// what, keyed by (key, offsets).
struct Plan {
  DcpMetadata metadata;
  std::map<std::pair<std::string, std::vector<int64_t>>, int64_t> writer;
};

void agree(const DcpEntry& first, const DcpEntry& other, int64_t first_rank, int64_t rank) {
  auto describe = [](const DcpEntry& e) {
    return e.is_tensor ? fmt::format("a {} tensor of ({})", c10::toString(e.dtype), fmt::join(e.size, ", "))
                       : std::string("an object");
  };
  if (first.is_tensor != other.is_tensor || first.dtype != other.dtype || first.size != other.size)
    throw InteropError(fmt::format("rank {} saves '{}' as {} and rank {} as {}", first_rank, first.fqn,
                                   describe(first), rank, describe(other)));
  if (path_json(first.path) != path_json(other.path))
    throw InteropError(fmt::format("ranks {} and {} place '{}' at different paths", first_rank, rank, first.fqn));
}

Plan plan_of(const std::vector<std::string>& texts) {
  Plan plan;
  std::map<std::string, std::pair<size_t, int64_t>> seen;  // index and first rank
  std::map<std::pair<std::string, std::vector<int64_t>>, std::vector<std::pair<int64_t, int64_t>>> holders;
  std::vector<std::pair<std::string, std::vector<int64_t>>> order;
  for (size_t rank = 0; rank < texts.size(); ++rank) {
    for (const json& item : json::parse(texts[rank])) {
      DcpEntry e;
      e.fqn = item["fqn"].get<std::string>();
      e.path = path_of(item["path"]);
      e.is_tensor = item["tensor"].get<bool>();
      std::vector<int64_t> offsets;
      if (e.is_tensor) {
        e.dtype = static_cast<c10::ScalarType>(item["dtype"].get<int>());
        e.size = item["size"].get<std::vector<int64_t>>();
        offsets = item["offsets"].get<std::vector<int64_t>>();
      }
      auto [it, fresh] = seen.try_emplace(e.fqn, plan.metadata.entries.size(), static_cast<int64_t>(rank));
      if (fresh) plan.metadata.entries.push_back(e);
      DcpEntry& entry = plan.metadata.entries[it->second.first];
      agree(entry, e, it->second.second, static_cast<int64_t>(rank));
      auto key = std::make_pair(e.fqn, offsets);
      auto& who = holders[key];
      if (who.empty()) {
        order.push_back(key);
        if (e.is_tensor) entry.chunks.push_back(DcpChunk{offsets, item["sizes"].get<std::vector<int64_t>>(), {}});
      } else if (e.is_tensor) {
        auto chunk = std::find_if(entry.chunks.begin(), entry.chunks.end(),
                                  [&](const DcpChunk& c) { return c.offsets == offsets; });
        if (chunk->sizes != item["sizes"].get<std::vector<int64_t>>())
          throw InteropError(fmt::format("{} different pieces of '{}' at ({})",
                                         who[0].first == static_cast<int64_t>(rank)
                                             ? fmt::format("rank {} saves two", rank)
                                             : fmt::format("ranks {} and {} save", who[0].first, rank),
                                         e.fqn, fmt::join(offsets, ", ")));
      }
      who.emplace_back(static_cast<int64_t>(rank), item["bytes"].get<int64_t>());
    }
  }
  // A box or object one rank holds is its; the others go, in order, to the
  // holder with the fewest bytes so far (objects to their lowest holder).
  std::vector<int64_t> load(texts.size(), 0);
  for (const auto& key : order) {
    const auto& who = holders[key];
    if (who.size() != 1) continue;
    plan.writer[key] = who[0].first;
    load[who[0].first] += who[0].second;
  }
  for (const auto& key : order) {
    const auto& who = holders[key];
    if (who.size() == 1) continue;
    auto best = who.begin();
    bool object = !plan.metadata.entries[seen[key.first].first].is_tensor;
    for (auto it = who.begin(); it != who.end() && !object; ++it)
      if (load[it->first] < load[best->first]) best = it;
    plan.writer[key] = best->first;
    load[best->first] += best->second;
  }
  return plan;
}

// A new file, written through and flushed to the disk by close().
class OutputFile {
 public:
  explicit OutputFile(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create");
  }
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  size_t write(const void* data, size_t size) {
    for (size_t done = 0; done < size;) {
      ssize_t n = ::write(fd_, static_cast<const char*>(data) + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot write");
      done += static_cast<size_t>(n);
    }
    written_ += size;
    return size;
  }
  uint64_t written() const { return written_; }
  void close() {
    bool synced = ::fsync(fd_) == 0;
    int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 || !synced) fail("cannot write");
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw InteropError(fmt::format("{} '{}': {}", what, path_.string(), std::strerror(errno)));
  }
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

void write_file(const std::filesystem::path& path, const std::string& data) {
  OutputFile file(path);
  file.write(data.data(), data.size());
  file.close();
}

// Step 2: this rank's boxes and objects into __<rank>_0.distcp; returns
// their storage entries.
json write_own(const std::vector<Offer>& offers, const Plan& plan, int64_t rank, const std::filesystem::path& into) {
  std::string name = fmt::format("__{}_0.distcp", rank);
  std::optional<OutputFile> file;
  json entries = json::array();
  for (const Offer& offer : offers) {
    const DcpEntry& e = offer.entry;
    std::vector<int64_t> offsets = e.is_tensor ? e.chunks[0].offsets : std::vector<int64_t>{};
    if (plan.writer.at({e.fqn, offsets}) != rank) continue;
    if (!file) file.emplace(into / name);
    // Each archive at a multiple of 64 bytes, so that its records (aligned
    // within it) are aligned in the file and load without a copy.
    static const char zeros[64] = {};
    file->write(zeros, (64 - file->written() % 64) % 64);
    uint64_t at = file->written();
    if (e.is_tensor) {
      // torch.save writes a view's whole storage: a compact copy on the CPU.
      torch::Tensor compact = offer.tensor.to(torch::kCPU).contiguous();
      if (compact.storage_offset() != 0 || compact.storage().nbytes() != compact.nbytes()) compact = compact.clone();
      detail::torch_save_to(compact, [&](const void* data, size_t size) { return file->write(data, size); });
    } else {
      file->write(offer.archive.data(), offer.archive.size());
    }
    entries.push_back({{"fqn", e.fqn}, {"tensor", e.is_tensor}, {"offsets", offsets}, {"offset", at},
                       {"length", file->written() - at}, {"file", name}});
  }
  if (file) file->close();
  return entries;
}

void attach(DcpMetadata& metadata, const std::map<std::string, size_t>& index, const json& storage) {
  DcpEntry& entry = metadata.entries[index.at(storage["fqn"].get<std::string>())];
  detail::DcpStorage where{storage["file"].get<std::string>(), storage["offset"].get<uint64_t>(),
                           storage["length"].get<uint64_t>()};
  if (!entry.is_tensor) entry.object = where;
  for (DcpChunk& chunk : entry.chunks)
    if (chunk.offsets == storage["offsets"].get<std::vector<int64_t>>()) chunk.storage = where;
}

// Step 4, on rank 0: the metadata, then the temporary folder in the
// checkpoint's place.
void commit(const DcpMetadata& metadata, const std::filesystem::path& temporary, const std::filesystem::path& folder) {
  write_file(temporary / ".metadata.tmp", detail::write_dcp_metadata(metadata));
  std::filesystem::rename(temporary / ".metadata.tmp", temporary / ".metadata");
  detail::sync_folder(temporary);  // every rank's file and the metadata, before the folder is put in place
  const std::filesystem::path parent = folder.parent_path().empty() ? "." : folder.parent_path();
  std::error_code error;
  if (!std::filesystem::exists(folder, error)) {
    std::filesystem::rename(temporary, folder);
    detail::sync_folder(parent);
    return;
  }
  if (::renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, folder.c_str(), RENAME_EXCHANGE) != 0) {
    // A file system without exchange: the old one aside, the new in, the old away.
    std::filesystem::path old = temporary;
    old += ".old";
    std::filesystem::rename(folder, old);
    std::filesystem::rename(temporary, folder);
    detail::sync_folder(parent);
    std::filesystem::remove_all(old, error);
    return;
  }
  detail::sync_folder(parent);
  std::filesystem::remove_all(temporary, error);
}

// Note [Temporary checkpoint folders]
// A save writes its folder as ".NAME.partial<pid>-<random>" beside NAME and
// renames it into place; a job killed mid-save leaves that folder behind, as
// large as the ranks' shards. As Note [Temporary checkpoint files] does for
// single files, rank 0 holds an flock on the temporary folder from just after
// making it until the rename, and each save removes the ".NAME.partial*"
// folders beside NAME that it can lock without waiting: a killed save's (the
// kernel dropped its lock), never a running one's. Between mkdir and flock a
// folder is unlocked and another save may remove it; so rank 0, once it holds
// the lock, checks that the name still leads to its folder, and makes another
// if not. Where the file system has no flock, rank 0 writes unlocked and no
// save removes anything.

// Closes the folder it holds, releasing its lock.
class FolderLock {
 public:
  FolderLock() = default;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock() { release(); }
  void hold(int fd) {
    release();
    fd_ = fd;
  }

 private:
  void release() {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }
  int fd_ = -1;
};

void remove_stale_partials(const std::filesystem::path& parent, const std::string& name) {
  const std::string prefix = "." + name + ".partial";
  std::vector<std::filesystem::path> candidates;
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator(parent, error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error))
    if (it->path().filename().string().rfind(prefix, 0) == 0) candidates.push_back(it->path());
  for (const auto& candidate : candidates) {
    const int fd = ::open(candidate.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && detail::names_same_file(fd, candidate.c_str()))
      std::filesystem::remove_all(candidate, error);
    ::close(fd);
  }
}

// Rank 0's temporary folder for `folder`, made and held by `lock`.
std::filesystem::path make_temporary(const std::filesystem::path& folder, FolderLock& lock) {
  std::error_code error;
  if (std::filesystem::exists(folder, error) && !is_distributed_checkpoint(folder) &&
      !std::filesystem::is_empty(folder, error))
    throw InteropError(fmt::format("'{}' exists and is not a distributed checkpoint; it is not replaced",
                                   folder.string()));
  std::filesystem::path parent = folder.parent_path().empty() ? "." : folder.parent_path();
  std::filesystem::create_directories(parent);
  remove_stale_partials(parent, folder.filename().string());
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::filesystem::path temporary =
        parent / fmt::format(".{}.partial{}-{}", folder.filename().string(), ::getpid(), std::random_device{}());
    std::filesystem::create_directory(temporary);
    const int fd = ::open(temporary.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;  // removed by another save's sweep already
    lock.hold(fd);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) return temporary;  // no flock on this file system: unlocked
      continue;                                    // another save's sweep holds it, to remove it
    }
    if (detail::names_same_file(fd, temporary.c_str())) return temporary;
  }
  throw InteropError(fmt::format("cannot make a temporary folder beside '{}': other saves removed each one made",
                                 folder.string()));
}

// Step 1 on every rank: its offers, and the global plan, checked. A rank
// that cannot plan says so in the exchange, so that no other waits for it.
Plan plan_everywhere(const DistributedStateDict& state, ProcessGroup* group, std::vector<Offer>& offers,
                     const std::string& saved) {
  json local;
  try {
    for (const auto& entry : state) offers.push_back(offer_of(entry));
    local = offers_json(offers);
  } catch (const std::exception& e) {
    local = {{"error", e.what()}};
  }
  std::vector<std::string> plans = all_gather_text(group, local.dump());
  for (size_t r = 0; r < plans.size(); ++r) {
    json one = json::parse(plans[r]);
    if (one.is_object())
      throw InteropError(fmt::format("cannot save {}: rank {}: {}", saved, r, one["error"].get<std::string>()));
  }
  Plan plan = plan_of(plans);
  DcpMetadata checked = plan.metadata;  // the boxes, before anything is written
  for (DcpEntry& entry : checked.entries) {
    entry.object.relative_path = "planned";
    for (DcpChunk& chunk : entry.chunks) chunk.storage.relative_path = "planned";
  }
  detail::check_dcp_metadata(checked, "the state of " + saved);
  return plan;
}

// Rank 0's temporary folder, known to every rank; rank 0 holds it locked.
std::filesystem::path agree_on_temporary(const std::filesystem::path& folder, ProcessGroup* group, int64_t rank,
                                         FolderLock& lock) {
  std::string outcome;  // the folder, or "!" and why there is none
  if (rank == 0) try {
      outcome = make_temporary(folder, lock).string();
    } catch (const std::exception& e) {
      outcome = std::string("!") + e.what();
    }
  if (group) outcome = group->broadcast_text(outcome);
  if (!outcome.empty() && outcome[0] == '!') throw InteropError(outcome.substr(1));
  return outcome;
}

// Step 3: every rank's storage entries into the metadata; the first rank's
// failure, if any.
std::string gather_storage(Plan& plan, const json& written, ProcessGroup* group) {
  std::vector<std::string> all = all_gather_text(group, written.dump());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < plan.metadata.entries.size(); ++i) index[plan.metadata.entries[i].fqn] = i;
  for (size_t r = 0; r < all.size(); ++r) {
    json one = json::parse(all[r]);
    if (one.contains("error")) return fmt::format("rank {}: {}", r, one["error"].get<std::string>());
    for (const json& storage : one["entries"]) attach(plan.metadata, index, storage);
  }
  return "";
}

}  // namespace

void save_distributed_checkpoint(const DistributedStateDict& state, const std::filesystem::path& folder,
                                 ProcessGroup* group) {
  const int64_t rank = group ? group->rank() : 0;
  const std::string saved = fmt::format("the distributed checkpoint '{}'", folder.string());
  std::vector<Offer> offers;
  Plan plan = plan_everywhere(state, group, offers, saved);
  FolderLock lock;  // Note [Temporary checkpoint folders]
  const std::filesystem::path temporary = agree_on_temporary(folder, group, rank, lock);
  json written;
  try {
    written = {{"entries", write_own(offers, plan, rank, temporary)}};
  } catch (const std::exception& e) {
    written = {{"error", e.what()}};
  }
  std::string failure = gather_storage(plan, written, group);
  if (rank == 0) {
    try {
      if (failure.empty()) commit(plan.metadata, temporary, folder);
    } catch (const std::exception& e) {
      failure = fmt::format("rank 0: {}", e.what());
    }
    std::error_code ignored;
    if (!failure.empty()) std::filesystem::remove_all(temporary, ignored);
  }
  if (group) failure = group->broadcast_text(failure);
  if (!failure.empty()) throw InteropError(fmt::format("cannot save {}: {}", saved, failure));
}

}  // namespace fulgor
