#pragma once

// Note [Distributed checkpoints]
// PyTorch's torch.distributed.checkpoint (DCP) saves a state into a folder in
// which every rank writes its own file, __<rank>_0.distcp, and rank 0 one
// .metadata: a pickle saying, for every flattened key, the dtype and whole
// size of a tensor and the chunks (offsets and sizes) it was saved in, or
// that the value is an object, and where in which file each chunk or object
// lies. A chunk is a torch.save archive at a byte offset; an object the
// torch.save archive of that object. A load at any number of ranks reads,
// for each tensor it wants, the byte ranges of the chunks that overlap the
// part it holds, and copies the overlap. fulgor writes the layout of
// python3-torch 2.6 (the pickle's classes, its flattening of nested dicts),
// which torch.distributed.checkpoint.load and dcp_to_torch_save read, and
// reads it (and 1.13's, which names the same classes in other modules) with
// the pickle reader that runs nothing.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

class ProcessGroup;

/// Where a rank's piece lies in the whole tensor: `offsets` per dimension,
/// and the whole tensor's `size`. The piece's own shape is its extent.
struct TensorPlacement {
  std::vector<int64_t> offsets;
  std::vector<int64_t> size;
};

/// One value of a state, by its place in the nested state: dict keys as
/// strings and list indices as ints, as Python's DCP records them.
struct DistributedCheckpointEntry {
  std::vector<c10::IValue> path;
  /// A tensor (the whole tensor, or a piece with `placement`), or any value
  /// torch_save writes, which is saved as torch.save's archive of it.
  c10::IValue value;
  std::optional<TensorPlacement> placement;
  /// The key DCP stores it under: the path joined with ".".
  FULGOR_API std::string fqn() const;
};

/// A state flattened for a distributed checkpoint, in the order of its
/// entries.
using DistributedStateDict = std::vector<DistributedCheckpointEntry>;

/// Flattens a nested state as Python's DCP does (flatten_state_dict):
/// dicts are walked, their keys made strings; a list is walked (indices as
/// ints) when it holds a tensor, a dict or such a list, and is one value
/// otherwise; everything else is one value.
/// Throws InteropError when `nested` is not a dict.
FULGOR_API DistributedStateDict flatten_state_dict(const c10::IValue& nested);

/// The nested state of `flat`, built back from the entries' paths (pieces
/// with a placement are refused: they are not the whole tensor).
FULGOR_API c10::IValue unflatten_state_dict(const DistributedStateDict& flat);

/// Saves `state` into the folder `folder`, every rank of `group` (or the one
/// process when `group` is null) calling it with its own entries.
///
/// Requires: every rank gives each key with the same dtype and whole size; a
/// tensor without a placement is whole on every rank that gives it (written
/// once, by the rank with the fewest bytes to write so far, as Python's
/// planner balances them); pieces with a placement do not overlap, except
/// identical ones, which are written once; an object is the same on every
/// rank that gives it (rank 0's, or the lowest giver's, is written).
/// Ensures: the folder is replaced whole or not at all: the ranks write into
/// a temporary folder beside it, which replaces `folder` once every file and
/// the metadata are complete; a folder already there is kept until then.
/// Throws InteropError naming the key and the ranks that disagree, or the
/// path that cannot be written; DistributedError when a collective fails.
FULGOR_API void save_distributed_checkpoint(const DistributedStateDict& state, const std::filesystem::path& folder,
                                            ProcessGroup* group = nullptr);

/// Fills `state` from the folder: each tensor (or piece, by its placement)
/// is copied in place from the parts of the saved chunks that overlap it,
/// reading only their byte ranges; each other value is replaced by the saved
/// one. Works at any number of ranks and with no process group, whatever
/// number of ranks saved it.
///
/// Throws InteropError naming the folder, the key and what is wrong: a key
/// not in the checkpoint, a dtype or whole size that differs, a part of the
/// tensor that no saved chunk covers, or a checkpoint that fails the checks
/// of read_distributed_checkpoint_metadata.
FULGOR_API void load_distributed_checkpoint(DistributedStateDict& state, const std::filesystem::path& folder);

/// The whole state of the folder, nested as it was saved (what Python's
/// dcp_to_torch_save writes): every tensor assembled from its chunks.
FULGOR_API c10::IValue read_distributed_checkpoint(const std::filesystem::path& folder);

/// Whether `folder` is a folder holding a .metadata file.
FULGOR_API bool is_distributed_checkpoint(const std::filesystem::path& folder);

}  // namespace fulgor
