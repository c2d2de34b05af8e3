#pragma once

#include <ATen/core/ivalue.h>
#include <torch/serialize/input-archive.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>

namespace fulgor::detail {

struct TrainerState;

// A checkpoint read for a loop: its file, archive and checked metadata; or,
// for a file Python wrote, what torch_load read of it and the loops' state
// it resumes at (Note [Resuming a Python run] in python_checkpoint.cpp).
// Move-only, as its archive. The copy is deleted with a const parameter:
// the implicit one would take a non-const reference, as the archive's does,
// which std::optional's defaulted copy rejects under clang.
struct LoadedCheckpoint {
  LoadedCheckpoint() = default;
  LoadedCheckpoint(const LoadedCheckpoint&) = delete;
  LoadedCheckpoint& operator=(const LoadedCheckpoint&) = delete;
  LoadedCheckpoint(LoadedCheckpoint&&) = default;
  LoadedCheckpoint& operator=(LoadedCheckpoint&&) = default;

  std::string path;
  torch::serialize::InputArchive archive;
  nlohmann::json meta;
  c10::IValue python;
  bool from_python() const { return !python.isNone(); }
};

torch::Tensor cpu_rng_state();
void set_cpu_rng_state(const torch::Tensor& state);

// Lightning's _CheckpointConnector: what a checkpoint holds of a Trainer, and
// putting it back. Resolves "last" and "best", saves, and restores in
// Lightning's order: the module and callbacks after the setup hooks, the
// training state after on_fit_start, the generators as the first epoch
// begins (Note [Resuming mid-epoch] in src/loops/fit_loop.cpp).
struct CheckpointConnector {
  explicit CheckpointConnector(TrainerState& state) : s(state) {}

  // A path as given, or "last" (the checkpoint folder's last.ckpt, else its
  // newest checkpoint) or "best" (the ModelCheckpoint's best_model_path).
  std::string resolve(const std::string& path) const;
  LoadedCheckpoint read(const std::string& requested) const;
  void save(const std::string& path);

  // Lightning's _restore_modules_and_callbacks.
  void restore_module_and_callbacks(LoadedCheckpoint& ckpt);
  // The callbacks' tensors (Note [Callback tensors in checkpoints]).
  void restore_callback_tensors(LoadedCheckpoint& ckpt);
  // Lightning's restore_training_state.
  void restore_training_state(LoadedCheckpoint& ckpt);
  // Warns naming the generator states a resume needs and `ckpt` lacks, or
  // with `deterministic` throws CheckpointError (Note [Missing generator
  // states]).
  void check_rng_states(LoadedCheckpoint& ckpt) const;
  // Sets the CPU generator from the archive's `cpu_key` entry and, with
  // "rng_cpu" and the same accelerator, the device's.
  void restore_rng(LoadedCheckpoint& ckpt, const char* cpu_key);

  // The CPU generator's state when the current epoch began.
  torch::Tensor rng_epoch_start;

 private:
  // The folders this Trainer has saved into, each cleared of stale temporary
  // files before its first save.
  std::set<std::string> swept_folders;

  TrainerState& s;
};

}  // namespace fulgor::detail
