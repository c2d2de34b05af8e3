#pragma once

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

class ModuleBase;
class Accelerator;

// Note [Checkpoint files]
// A checkpoint is one file: a 28-byte header, a LibTorch archive
// (torch::serialize::OutputArchive, the same zip container on every LibTorch
// version), then the archive's chunk hashes. docs/training.md describes it
// byte by byte.
//   bytes 0..7    "FULGORCK"
//   bytes 8..11   container version, little-endian uint32 (4)
//   bytes 12..19  N, the archive's length in bytes, little-endian uint64
//   bytes 20..27  XXH3-64 (seed 0) of the list of chunk hashes, little-endian
//   then          the archive, N bytes
//   then          K = ceil(N / 262144) little-endian uint64s: the XXH3-64 of
//                 each 256 KiB chunk of the archive, the last one partial
// Version 3 files, with the XXH3-64 of the whole archive in bytes 20..27 and
// no list, and version 2 files, with FNV-1a over the archive's little-endian
// 64-bit words (the last zero-padded) there, are still read.
// The header lets a truncated, corrupted or foreign file be recognised before
// LibTorch parses it, and the chunk hashes let each chunk be checked as it
// is read (Note [Checked chunks] in src/checkpoint/chunks.h). The archive
// holds:
//   "meta"        a JSON string: format, fulgor and LibTorch versions, loop
//                 progress, callback states, scheduler states, hyper-parameters
//                 and the module's on_save_checkpoint state
//   "model"       the module's parameters and buffers (ModuleBase::save)
//   "optimizer_N" each optimizer's state
//   "rng_cpu", "rng_device", "rng_epoch_start"
//                 generator states: the CPU's and the accelerator's now, and
//                 the CPU's when the epoch began (the sampler's shuffle)
//   "grad_scaler" the loss scaler's state, with fp16 mixed precision
// Files are written atomically: a temporary file in the same folder, written
// (the archive streamed, the hashes after it, the header's length and hash
// filled in last), fsync'ed, then renamed over the destination, then the
// folder is fsync'ed. A crash or a full disk leaves the previous file intact. See
// Note [Temporary checkpoint files] (src/checkpoint/checkpoint.cpp) for what a crash
// leaves behind and how it is removed.

/// Writes `archive` to `path` as a checkpoint file, atomically.
/// Throws CheckpointError naming the file and the system's reason, or saying
/// that `path` exists and is not a regular file.
FULGOR_API void write_checkpoint_file(const std::string& path, torch::serialize::OutputArchive& archive);

/// Reads a checkpoint file onto the CPU. Throws CheckpointError naming the
/// file when it is missing, not a regular file, truncated, corrupted, of
/// another format or version.
FULGOR_API torch::serialize::InputArchive read_checkpoint_file(const std::string& path);

/// The "meta" JSON of a checkpoint file (versions, epoch, global step, ...).
FULGOR_API nlohmann::json read_checkpoint_meta(const std::string& path);

/// Copies the parameters and buffers saved in the checkpoint at `path` into
/// `module`, wherever its tensors live (Lightning's load_from_checkpoint for
/// the weights). Throws CheckpointError naming a missing or misshapen tensor,
/// or one whose dtype differs from the module's, with both dtypes (Note
/// [Checkpoint dtypes] in src/checkpoint/checkpoint.cpp): nothing is cast silently.
FULGOR_API void load_module_weights(ModuleBase& module, const std::string& path);

// Exported for the tests (Note [Exported symbols] in fulgor/core/export.h).
namespace impl {
// Removes the temporary files that writers killed mid-save left in `dir`,
// sparing those a live writer holds (Note [Temporary checkpoint files]).
// Best effort: what cannot be examined or removed stays, silently.
FULGOR_API void remove_stale_temporaries(const std::string& dir);

// Copies the tensors of `archive` (read onto the CPU) into the module's
// parameters and buffers in place.
FULGOR_API void load_module_state(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                                  const std::string& path);
}  // namespace impl

namespace detail {
using impl::load_module_state;
using impl::remove_stale_temporaries;

// Replaces every tensor `archive` holds (nested archives, lists, dicts and
// tuples included) by a copy in host memory, pinned when `pin` and the tensor
// is on a device, so that the archive no longer shares memory with the live
// tensors it was written from (Note [Snapshots of an archive] in
// src/checkpoint/snapshot.cpp). Returns the copies of the tensors that had
// other owners, to be kept until the archive is written, so that its file is
// byte for byte the one the live tensors give. `storages` holds the previous
// snapshot's storages, reused where they fit once its write has completed
// (Note [Reusing snapshot memory]), and is given this snapshot's.
std::vector<torch::Tensor> snapshot_to_host(torch::serialize::OutputArchive& archive, bool pin,
                                            std::vector<c10::Storage>& storages);
}  // namespace detail

}  // namespace fulgor
