#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <exception>
#include <string>
#include <typeinfo>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

class Trainer;
class ModuleBase;

namespace impl {
[[noreturn]] FULGOR_API void throw_batch_type_mismatch(bool took, const std::type_info* held,
                                                       const std::type_info& asked);
}

/// What the batch-end hooks are given (Lightning's `outputs, batch,
/// batch_idx, dataloader_idx`): a view of the step that just ended, valid
/// during the hook only.
///
/// Contract: `outputs` is training_step's loss without its autograd graph
/// (undefined when it skipped the batch), or predict_step's prediction;
/// validation_step and test_step return nothing, so it is undefined there.
/// batch<B>() is the very batch the step was given (after the transfer hooks,
/// on the device), where B is the module's batch type; it throws Error for
/// another type, and when the batch type cannot be copied (then the step took
/// the batch, and has_batch() is false). dataloader_idx is 0: a loop has one
/// loader. batch_indices, in prediction, are the data set's indices of the
/// batch's samples where the loader tells (TensorLoader; Note [The loader
/// protocol]), else nullptr.
struct BatchEnd {
  const torch::Tensor& outputs;
  int64_t batch_idx = 0;
  int64_t dataloader_idx = 0;
  const void* batch_data = nullptr;
  const std::type_info* batch_type = nullptr;
  const std::vector<int64_t>* batch_indices = nullptr;

  bool has_batch() const { return batch_data != nullptr; }
  template <typename B>
  const B& batch() const {
    if (batch_data == nullptr || *batch_type != typeid(B))
      impl::throw_batch_type_mismatch(batch_data == nullptr, batch_type, typeid(B));
    return *static_cast<const B*>(batch_data);
  }
};

/// A small object the Trainer calls at fixed points of its loops (Lightning's
/// Callback). Every hook has a no-op default; override the ones you need. Any
/// hook may stop training with `trainer.request_stop(reason)`.
///
/// The batch-end hooks come in two forms: the one taking a BatchEnd (the
/// batch and the step's outputs, as Lightning's) is what the Trainer calls,
/// and by default it calls the shorter one, so a callback overrides either.
///
/// Contract: hooks are called in Lightning's order (docs/training.md, "Hook
/// order"): at each point the callbacks' hook before the module's, except
/// that the monitoring callbacks (monitors_metrics(): ModelCheckpoint,
/// EarlyStopping) get on_train_epoch_end after the module. Hooks are called on the thread that called
/// fit/validate/test/predict. A callback with state that must survive a resume
/// returns it from state_dict() and takes it back in load_state_dict(); the
/// checkpoint files it under state_key(), which must differ between the
/// callbacks of one Trainer.
class FULGOR_API Callback {
 public:
  virtual ~Callback() = default;

  // ---- What the Trainer asks of a callback (Lightning's isinstance checks) ----
  /// Saves checkpoints (ModelCheckpoint): such callbacks come after the
  /// others, so that they save what the others did.
  virtual bool saves_checkpoints() const { return false; }
  /// Acts on a monitored metric (ModelCheckpoint, EarlyStopping): gets
  /// on_train_epoch_end after the module's, so that it sees what was logged there.
  virtual bool monitors_metrics() const { return false; }
  /// Shows the progress (ProgressBar) or the model's summary (ModelSummary):
  /// the Trainer adds its own only when no callback does (enable_progress_bar,
  /// enable_model_summary), and under ddp only rank 0 keeps such callbacks.
  virtual bool shows_progress() const { return false; }
  virtual bool summarizes_model() const { return false; }

  /// The key of this callback's state in checkpoints (default: its type's name).
  virtual std::string state_key() const;
  virtual nlohmann::json state_dict() const { return nlohmann::json(); }
  virtual void load_state_dict(const nlohmann::json& /*state*/) {}

  // The hooks, one per entry of the catalogue fulgor/callback_hooks.def
  // (which says what each is given), each with a no-op default.
#define FULGOR_HOOK(name) \
  virtual void name(Trainer&, ModuleBase&) {}
#define FULGOR_HOOK_WITH(name, Type) \
  virtual void name(Trainer&, ModuleBase&, Type) {}
#define FULGOR_BATCH_END(name, types, from_end)                                  \
  virtual void name(Trainer&, ModuleBase&, FULGOR_HOOK_UNPAREN types) {}        \
  virtual void name(Trainer& trainer, ModuleBase& module, const BatchEnd& end) { \
    name(trainer, module, FULGOR_HOOK_UNPAREN from_end);                         \
  }
#define FULGOR_HOOK_UNPAREN(...) __VA_ARGS__
#include "fulgor/callback_hooks.def"
#undef FULGOR_HOOK_UNPAREN

  // Note [Callback tensors in checkpoints]
  // Some state is tensors, which the JSON of state_dict() cannot carry (the
  // averaged weights of WeightAveraging). A callback writes them into its own
  // archive, which the checkpoint keeps beside the model under an entry that
  // its metadata's "callback_tensors" names for state_key(); they are read
  // back after on_load_checkpoint, before load_state_dict.
  /// Writes this callback's tensors; returns whether it wrote any (when not,
  /// the checkpoint keeps no entry and load_tensors is not called). Called
  /// before swap_checkpoint_weights. An archive refers to the tensors written
  /// into it until the checkpoint file is complete: write copies of tensors
  /// that change meanwhile.
  virtual bool save_tensors(Trainer&, ModuleBase&, torch::serialize::OutputArchive& /*archive*/) { return false; }
  virtual void load_tensors(Trainer&, ModuleBase&, torch::serialize::InputArchive& /*archive*/) {}
  /// Called just before a checkpoint's model is written and again once the file is complete:
  /// a callback whose checkpoints should hold other weights than the module's
  /// (WeightAveraging: the averaged ones) swaps them in, then back. Must be
  /// its own inverse.
  virtual void swap_checkpoint_weights(ModuleBase&) {}
};

}  // namespace fulgor
