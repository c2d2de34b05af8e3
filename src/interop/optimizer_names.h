#pragma once

// Note [Optimizer states by parameter names]
// torch.optim's state_dict() numbers the parameters 0, 1, ... across its
// param groups, in "state" and in each group's "params". PyTorch's
// distributed state dicts (torch.distributed.checkpoint.state_dict's
// get_optimizer_state_dict, FSDP's optim_state_dict, which Lightning's FSDP
// strategies save) name them instead, by the module's parameter names. A
// sharded checkpoint holds an optimizer's state by names where every
// parameter it steps has one (Note [Sharded training checkpoints]); a load
// takes either, numbers where they are numbers, names turned into the
// numbers of the optimizer's own parameters of those names.

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace fulgor::detail {

// Parameter names by the parameters' TensorImpl.
using ParameterNames = std::unordered_map<const void*, std::string>;

// The names of `modules`' parameters, as named_parameters() gives them (the
// names a state dict has).
ParameterNames parameter_names(const std::vector<const torch::nn::Module*>& modules);

// The names of `params`, in order; nullopt when one of them has none or two
// share one (the state is then kept by numbers).
std::optional<std::vector<std::string>> names_of(const std::vector<torch::Tensor>& params, const ParameterNames& names);

// `state` (torch.optim's layout) with each parameter number n replaced by
// keys[n].
c10::IValue by_parameter_names(const c10::IValue& state, const std::vector<std::string>& keys);

// `state` by torch.optim's numbers for `optimizer`, whose groups hold the
// parameters `names` names: as it is when it numbers them already. Throws
// InteropError naming `source` and a name that is none of the optimizer's
// parameters.
c10::IValue by_parameter_numbers(const c10::IValue& state, const torch::optim::Optimizer& optimizer,
                                 const ParameterNames& names, const std::string& source);

}  // namespace fulgor::detail
