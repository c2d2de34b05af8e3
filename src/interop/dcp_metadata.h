#pragma once

// The .metadata of a distributed checkpoint (Note [Distributed checkpoints]
// in fulgor/interop/distributed_checkpoint.h) as C++ values, its pickle
// written as python3-torch 2.6 writes it and read with the checks of
// Note [A distributed checkpoint from elsewhere].
//
// Note [A distributed checkpoint from elsewhere]
// A folder may come from anyone. Its .metadata is read by the pickle reader
// that runs nothing, in a dialect that constructs only the metadata's
// dataclasses. Then every tensor must have a known dtype, a size whose
// element count fits in int64, and chunks inside it that do not overlap and
// cover it whole (at most kMaxChunks of them); every chunk and every object
// must have exactly one storage entry, naming a file directly in the folder
// (no separator, no "." or ".."), and, when the files are opened, lie inside
// its file, which must be a regular file and not a link.

#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace fulgor::detail {

constexpr size_t kMaxChunks = 16384;

/// Where a chunk or an object lies: `length` bytes of the file
/// `relative_path` (in the checkpoint's folder) from `offset` on.
struct DcpStorage {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
};

/// A box of a tensor: `sizes` elements from `offsets` on in each dimension.
struct DcpChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  DcpStorage storage;
};

/// One key of the checkpoint: a tensor (its dtype, whole size and chunks) or
/// an object (one storage: torch.save's archive of it).
struct DcpEntry {
  std::string fqn;
  std::vector<c10::IValue> path;  ///< planner_data: where it sits in the nested state
  bool is_tensor = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> size;
  std::vector<DcpChunk> chunks;
  DcpStorage object;  ///< for an object
};

struct DcpMetadata {
  std::vector<DcpEntry> entries;  ///< in the order of state_dict_metadata
};

/// The .metadata pickle of `metadata`, as python3-torch 2.6 writes it
/// (storage_meta None).
std::string write_dcp_metadata(const DcpMetadata& metadata);

/// Reads a .metadata pickle and checks it (Note [A distributed checkpoint
/// from elsewhere], but for the files, which check_dcp_files does). `source`
/// names it in errors. Throws InteropError.
DcpMetadata read_dcp_metadata(const uint8_t* data, size_t size, const std::string& source);

/// Refuses what is not well-formed in `metadata`: the checks of
/// Note [A distributed checkpoint from elsewhere] that need no file.
void check_dcp_metadata(const DcpMetadata& metadata, const std::string& source);

/// The top-level keys of the state a distributed checkpoint's folder holds,
/// in the order of its metadata, each once (src/interop/distributed_checkpoint.cpp).
std::vector<std::string> distributed_checkpoint_keys(const std::filesystem::path& folder);

/// read_distributed_checkpoint's whole state, of the entries nested under
/// the top-level `key` alone ("" for all): the other keys' bytes are not
/// read (src/interop/distributed_checkpoint.cpp).
c10::IValue read_distributed_checkpoint_under(const std::filesystem::path& folder, const std::string& key);

}  // namespace fulgor::detail
