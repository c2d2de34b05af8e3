#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "detail/regular_file.h"

namespace fulgor {
class Accelerator;
namespace detail {

// Note [The loaded checkpoint]
// A checkpoint the Trainer resumes or evaluates from is read once, by the
// reader of its file's format, into one form that the checkpoint connector
// restores without asking where it came from:
//  - `meta`: the metadata as fulgor writes it (Note [Checkpoint metadata]),
//    holding only what the file holds. A file Python wrote gives the loops'
//    state and the schedulers' states; it names no accelerator and holds no
//    module, data module or callback state, so the hooks that read those are
//    not called and no generator state is missed (Note [Missing generator
//    states]).
//  - `archive`: the entries of fulgor's format that are read by name
//    (generator states, the GradScaler's, the callbacks' tensors); empty for
//    a file that has none.
//  - `restore_weights` and `restore_optimizers`: what the file holds of the
//    module and the optimizers put into them, by the file's own reader,
//    with its own errors; the schedulers' states are in `meta`.
// Shared, so that the restores keep the archive they read alive.
struct LoadedCheckpoint {
  using Optimizers = std::vector<std::shared_ptr<torch::optim::Optimizer>>;

  std::string path;
  nlohmann::json meta;
  std::shared_ptr<torch::serialize::InputArchive> archive = std::make_shared<torch::serialize::InputArchive>();
  // The weights into `module`, strictly; throws naming the file.
  std::function<void(torch::nn::Module& module)> restore_weights;
  // The states of the optimizers configure_optimizers returned, one each in
  // order, their tensors on `device`, their parameters `module`'s (whose
  // names a sharded checkpoint keys them by); throws CheckpointError when
  // the file holds another number of them.
  std::function<void(const Optimizers& optimizers, const torch::nn::Module& module, const Accelerator& accelerator,
                     torch::Device device)>
      restore_optimizers;
};

// A fulgor checkpoint file (read_checkpoint_file), open at `file`, in the
// loaded form, its metadata checked (parse_checkpoint_meta).
LoadedCheckpoint load_checkpoint(const RegularFile& file, const std::string& path);

}  // namespace detail
}  // namespace fulgor
