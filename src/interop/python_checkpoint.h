#pragma once

#include <string>

#include "checkpoint/loaded.h"

namespace fulgor::detail {

// Whether `file` is a torch.save zip archive (a Lightning .ckpt or a
// {model, optimizer} checkpoint written by Python), told from its first
// bytes: fulgor's own checkpoints begin otherwise (Note [Checkpoint files]).
bool is_python_checkpoint(const RegularFile& file);

// The metadata fulgor's loops and schedules resume from (Note [Checkpoint
// metadata]'s "loop" and "schedulers") of `checkpoint`, a dict Python
// wrote: a Lightning .ckpt, or the meta.pt of Lightning's sharded folder.
nlohmann::json python_checkpoint_meta(const c10::IValue& checkpoint, const std::string& path);

// A checkpoint Python wrote, translated into the form fulgor's own are
// loaded in (Note [The loaded checkpoint]): Lightning's loop progress as the
// loops' state, the torch schedulers' states as fulgor's schedules keep
// them, and the weights and torch.optim states restored through interop's
// readers (Note [Resuming a Python run]).
// `file` is the open `path`, the descriptor read (Note [Opening a user's path]).
LoadedCheckpoint load_python_checkpoint(const RegularFile& file, const std::string& path);

}  // namespace fulgor::detail
