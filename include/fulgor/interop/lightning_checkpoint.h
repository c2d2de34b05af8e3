#pragma once

#include <torch/nn/module.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/module.h"
#include "fulgor/optim/scheduler.h"

namespace fulgor {

/// What a Lightning .ckpt is written with.
struct LightningCheckpointOptions {
  /// Put before every state_dict key: the attribute of the LightningModule
  /// that holds the network ("model."), or "" where the LightningModule's
  /// own attribute names are the module's.
  std::string prefix;
  /// "epoch" and "global_step" (Lightning's trainer.current_epoch and
  /// global_step). export_lightning_checkpoint takes them from the fulgor
  /// checkpoint.
  int64_t epoch = 0;
  int64_t global_step = 0;
  /// "hyper_parameters", the keyword arguments load_from_checkpoint passes
  /// to the LightningModule's constructor (a JSON object; null: none).
  /// export_lightning_checkpoint takes the module's from the checkpoint.
  nlohmann::json hyper_parameters;
  /// "pytorch-lightning_version": the Lightning whose format is written.
  std::string lightning_version = "2.6.5";
};

/// What a Lightning .ckpt could not hold, each in words ("lr_schedulers[1]:
/// fulgor::CyclicLR's state has no torch counterpart fulgor writes").
struct LightningCheckpointReport {
  std::vector<std::string> left_out;
};

/// Writes `module` and the optimizers and schedulers of `optim` as Lightning's
/// Trainer.save_checkpoint does (Note [Writing a Lightning checkpoint] in
/// src/interop/lightning_checkpoint.cpp): "epoch", "global_step",
/// "pytorch-lightning_version", "state_dict" (the module's tensors, keys
/// prefixed), "hyper_parameters" (with "hparams_name": "kwargs") when given,
/// "optimizer_states" (export_optimizer_state of each) and "lr_schedulers"
/// (torch's state_dict of each schedule with one: the schedules whose state
/// is last_epoch, _step_count, base_lrs and _last_lr, and
/// CosineAnnealingWarmRestarts). "loops" and "callbacks" are left out:
/// Lightning then starts its loops' counters afresh.
///
/// Ensures: torch.load(path, weights_only=True) reads it on torch 2.x (torch
/// 1.13's weights-only reader has no float opcode, and hyper-parameters are
/// floats: weights_only=False reads it there); Lightning's
/// load_from_checkpoint and Trainer.fit(ckpt_path=...) find every key they
/// read; the file is replaced whole or not at all. A schedule left out is
/// named in the report and lr_schedulers ends before it.
/// Throws InteropError for an optimizer other than SGD, Adam or AdamW, or
/// hyper-parameters that are not a JSON object.
FULGOR_API LightningCheckpointReport save_lightning_checkpoint(const torch::nn::Module& module,
                                                               const OptimizerConfig& optim,
                                                               const std::filesystem::path& path,
                                                               const LightningCheckpointOptions& options = {});

/// Writes the fulgor checkpoint at `fulgor_checkpoint` as a Lightning .ckpt:
/// its weights are loaded into `module` (of the class that was trained), whose
/// configure_optimizers makes the optimizers and schedulers the checkpoint's
/// states are loaded into; epoch, global_step and hyper_parameters are the
/// checkpoint's, `options.prefix` and the version as given. Throws
/// CheckpointError naming the file when its states do not fit the module's.
FULGOR_API LightningCheckpointReport export_lightning_checkpoint(ModuleBase& module,
                                                                 const std::filesystem::path& fulgor_checkpoint,
                                                                 const std::filesystem::path& path,
                                                                 LightningCheckpointOptions options = {});

}  // namespace fulgor
