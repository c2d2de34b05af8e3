#pragma once

#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include <string>

#include "fulgor/module.h"
#include "fulgor/optim/scheduler.h"

namespace fulgor::detail {

// Whether `path` is a torch.save zip archive (a Lightning .ckpt or a
// {model, optimizer} checkpoint written by Python), told from its first
// bytes: fulgor's own checkpoints begin otherwise (Note [Checkpoint files]).
bool is_python_checkpoint(const std::string& path);

// The loops' state (FitLoop::state_dict's keys) a Python checkpoint resumes
// at: Lightning's fit loop progress, or the start of a fit for a checkpoint
// without one (Note [Resuming a Python run]).
nlohmann::json python_loop_state(const c10::IValue& checkpoint, const std::string& path);

// The checkpoint's weights ("state_dict" or "model") into the module, by
// name, strictly.
void restore_python_weights(ModuleBase& module, const c10::IValue& checkpoint, const std::string& path);

// The checkpoint's torch.optim states into the optimizers (one each, in
// order) and its torch schedulers' states, where they map, into the
// schedulers.
void restore_python_optimizers(OptimizerConfig& optim, const c10::IValue& checkpoint, const std::string& path);

}  // namespace fulgor::detail
