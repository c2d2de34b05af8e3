#pragma once

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

/// Puts a torch.optim state dict (Python's `optimizer.state_dict()`:
/// {"state": {id: {...}}, "param_groups": [{..., "params": [id, ...]}]})
/// into a LibTorch optimizer of the same kind, so that its next step is the
/// one torch.optim would take (Note [torch.optim state in LibTorch] in
/// src/interop/optimizer_state.cpp).
///
/// Requires: `optimizer` is a torch::optim::SGD, Adam or AdamW with as many
/// parameter groups, of as many parameters each, as Python's; torch.optim's
/// integer ids, in param_groups order, name the optimizer's parameters in
/// the order it holds them (a fulgor Module gives them in Python's order of
/// `parameters()` for a network of the same names).
/// Ensures: each group's hyper-parameters (lr, momentum, dampening,
/// weight_decay, nesterov; lr, betas, eps, weight_decay, amsgrad) are
/// Python's, and each parameter's state (momentum_buffer; step, exp_avg,
/// exp_avg_sq, max_exp_avg_sq) is a copy of Python's on the parameter's
/// device and dtype; a parameter Python has no state for has none.
/// Nothing is changed when anything does not fit.
/// Throws InteropError naming `source` and what does not fit: the kind of
/// optimizer, the number of groups or parameters, a state tensor's shape
/// (with the parameter's index and both shapes), a missing or mistyped
/// entry, an option LibTorch lacks (maximize).
FULGOR_API void import_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state_dict,
                                       const std::string& source);

/// Reads `path` with torch_load and imports from it the `index`-th state of
/// a Lightning .ckpt's "optimizer_states", the "optimizer" of a
/// {"model": ..., "optimizer": ...} checkpoint, or a bare
/// `optimizer.state_dict()`; errors name the file.
FULGOR_API void import_optimizer_state(torch::optim::Optimizer& optimizer, const std::filesystem::path& path,
                                       size_t index = 0);

/// The torch.optim state dicts a checkpoint holds: Lightning's
/// "optimizer_states", or a one-element list of {model, optimizer}'s
/// "optimizer", or of a bare optimizer state dict; empty when there is none.
FULGOR_API std::vector<c10::IValue> optimizer_states_in(const c10::IValue& checkpoint);

/// The optimizer's state as torch.optim's state_dict() of the same optimizer
/// has it, which Python's `optimizer.load_state_dict` takes (torch 1.13 and
/// 2.x): parameters numbered 0, 1, ... in the order the optimizer holds them,
/// across its groups; each group's hyper-parameters under torch.optim's names
/// (with maximize False and torch.optim's defaults for the switches LibTorch
/// lacks); `step` a float32 scalar tensor, as torch.optim keeps it; state
/// tensors on the CPU. Throws InteropError naming an optimizer other than
/// SGD, Adam or AdamW.
FULGOR_API c10::IValue export_optimizer_state(const torch::optim::Optimizer& optimizer);

}  // namespace fulgor
