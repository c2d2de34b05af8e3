#pragma once

#include <torch/serialize/output-archive.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/background_writer.h"
#include "checkpoint/loaded.h"
#include "fulgor/interop/distributed_checkpoint.h"

namespace fulgor::detail {

struct TrainerState;

// Lightning's _CheckpointConnector: what a checkpoint holds of a Trainer, and
// putting it back. Resolves "last" and "best", saves, and restores in
// Lightning's order: the module and callbacks after the setup hooks, the
// training state after on_fit_start, the generators as the first epoch
// begins (Note [Resuming mid-epoch] in src/loops/fit_loop.cpp).
struct CheckpointConnector {
  explicit CheckpointConnector(TrainerState& state) : s(state) {}

  // A path as given, or "last" (the newest last checkpoint; "" with a
  // warning when there is none: Note [Resolving "last"] in the .cpp) or
  // "best" (the ModelCheckpoint's best_model_path). A collective under ddp.
  std::string resolve(const std::string& path) const;
  // The checkpoint at `path` (resolved), fulgor's or one Python wrote, in
  // the one loaded form the restores below take (Note [The loaded
  // checkpoint] in src/checkpoint/loaded.h).
  LoadedCheckpoint read(const std::string& path) const;
  // Saves synchronously: returns once the file is on disk, after the
  // asynchronous write in flight, if any.
  void save(const std::string& path);
  // With state_dict_type "sharded", throws ConfigError for an optimizer whose
  // state a sharded checkpoint cannot hold; a fit checks before it trains.
  void check_sharded_saves() const;
  // Saves asynchronously (Note [Asynchronous checkpoints]): returns once the
  // state is copied to host memory; `on_written` runs on this thread once the
  // file is on disk. Waits first for the write in flight, if any, as the
  // profiler action "wait_for_checkpoint_write".
  void save_async(const std::string& path, std::function<void()> on_written);
  // After each training batch: finishes a write that has ended, which throws
  // its CheckpointError. An atomic load when none has.
  void poll() {
    if (writer_.pending() && writer_.ended()) writer_.finish();
  }
  // Waits for the write in flight, if any, and finishes it; under ddp every
  // rank calls it, and all then wait for rank 0's file.
  void wait_for_write();
  // Waits for the write in flight while an exception unwinds: returns its
  // error ("" if none) rather than throwing it.
  std::string wait_for_write_quietly() { return writer_.finish_quietly(); }

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
 private:
  // This process's choice for "last" ("" for none).
  std::string find_last() const;
  nlohmann::json meta();
  // The archive of the state now; with `snapshot`, of copies in host memory,
  // and the copies to keep with it (snapshot_to_host).
  // `weights`: with the module's and the optimizers' states, which a sharded
  // checkpoint holds apart.
  torch::serialize::OutputArchive archive(std::vector<torch::Tensor>* snapshot, bool weights = true);
  DistributedStateDict sharded_state(torch::serialize::OutputArchive& rest, bool snapshot);
  void save_sharded(const std::string& path);
  void save_sharded_async(const std::string& path, std::function<void()> on_written);
  // Whether this process writes the files (rank 0 under ddp); clears the
  // folder of `path` of stale temporaries before its first save there.
  bool prepare_to_write(const std::string& path);

  // The folders this Trainer has saved into, each cleared of stale temporary
  // files before its first save.
  std::set<std::string> swept_folders;
  // The last snapshot's host memory: in use by its write, then reused by the
  // next snapshot (Note [Reusing snapshot memory] in src/checkpoint/snapshot.cpp).
  std::vector<c10::Storage> snapshot_storages_;
  // Likewise the host copies of the module's entries of a sharded
  // checkpoint (sharded_state).
  std::vector<torch::Tensor> sharded_snapshot_;
  BackgroundWriter writer_;

  TrainerState& s;
};

}  // namespace fulgor::detail
