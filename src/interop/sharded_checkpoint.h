#pragma once

// Note [Sharded training checkpoints]
// With state_dict_type "sharded" a training checkpoint is a distributed
// checkpoint's folder (Note [Distributed checkpoints]) that every rank writes
// its part of, as Lightning's FSDP strategy saves one, nothing gathered:
//   "model"        the module's state dict by Python's names: whole tensors
//                  (each written once, by the rank with the least to write),
//                  and where a parameter's values live only in the ranks'
//                  pieces (a FULL_SHARD unit's between its passes), each
//                  rank's piece
//   "optimizer_N"  each optimizer's state in torch.optim's layout
//                  (export_optimizer_state), its parameters named as the
//                  module names them (Note [Optimizer states by parameter
//                  names]), the states of sharded parameters as each
//                  rank's piece of the whole
//   "fulgor"       {"archive": the bytes, as a uint8 tensor, of the archive
//                  a checkpoint file holds (Note [Checkpoint files]) less
//                  "model" and "optimizer_N": the metadata, the generators'
//                  states, the callbacks' tensors, the loss scaler's},
//                  rank 0's
// Fabric's save (Note [Fabric checkpoints]) writes each module and optimizer
// of its state under the item's name so, and the rest (its metadata, the
// archives and tensors) as "fulgor"/"archive".
// A piece is a range of the parameter's flattened elements (Note [Parameter
// shards]), and a checkpoint holds boxes of the whole tensor: the range is
// saved as the fewest boxes that make it up, a partial row, whole rows and a
// partial row, in each dimension. PyTorch's dcp.load and dcp_to_torch_save
// read the model and the optimizers' states at any world size; a load here
// reads them whole, as from a checkpoint file, and the strategy cuts them.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/output-archive.h>

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/loaded.h"
#include "fulgor/interop/distributed_checkpoint.h"
#include "interop/optimizer_names.h"

namespace fulgor::detail {

class ParameterShards;
// The shards of the modules a checkpoint saves (none without sharding).
using ShardSets = std::vector<const ParameterShards*>;

// Adds the module's parameters and buffers under `key`, by state_dict_of's
// names: a parameter whose values `shards` hold alone as this rank's piece.
// The entries refer to the module's tensors.
void add_module_entries(DistributedStateDict& state, const std::string& key, const torch::nn::Module& module,
                        const ShardSets& shards);

// Adds `optimizer`'s state under `key` in torch.optim's layout, by the
// parameters' `names` where each has one (Note [Optimizer states by
// parameter names]): the states of `shards`' pieces as pieces of the whole.
// Throws InteropError for an optimizer export_optimizer_state does not
// export.
void add_optimizer_entries(DistributedStateDict& state, const std::string& key,
                           const torch::optim::Optimizer& optimizer, const ShardSets& shards,
                           const ParameterNames& names);

// Adds `archive` (the rest of a checkpoint) as "fulgor"/"archive".
void add_archive_entry(DistributedStateDict& state, torch::serialize::OutputArchive& archive);

// Throws ConfigError naming `which` (an optimizer, in words) unless its
// state can be saved in a sharded checkpoint (SGD, Adam, AdamW and
// fulgor's: export_optimizer_state's kinds).
void require_saves_sharded(const torch::optim::Optimizer& optimizer, const std::string& which);

// The archive a sharded checkpoint's folder holds as "fulgor"/"archive",
// null when it holds none; throws CheckpointError naming `folder` when it is
// not an archive.
std::shared_ptr<torch::serialize::InputArchive> read_archive_entry(const std::string& folder);

// The nested state under the top-level `key` of a distributed checkpoint's
// folder (a module's state dict, an optimizer's); throws CheckpointError
// naming `folder` when it has none.
c10::IValue read_entry(const std::string& folder, const std::string& key);

// A folder of a sharded training checkpoint, fulgor's or Lightning's (Note
// [Lightning's sharded checkpoints] in the .cpp), in the loaded form (Note
// [The loaded checkpoint]): its metadata and archive read at once, the
// module's and each optimizer's states when restored. Throws
// CheckpointError naming the folder when it holds neither's state.
LoadedCheckpoint load_sharded_checkpoint(const std::string& folder);

}  // namespace fulgor::detail
