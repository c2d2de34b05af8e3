#pragma once

// The parameters' shards of the sharded strategies (ZeRO-1 and ZeRO-2).

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <vector>

#include "fulgor/distributed/process_group.h"

namespace fulgor::detail {

// Note [Parameter shards]
// ZeRO's partitioning on c10d's collectives, no collective of fulgor's own.
// Every trainable parameter is flattened and cut into as many equal pieces
// as there are ranks, the last padded with zeros; rank r keeps piece r as a
// shard, a leaf tensor that the optimizers step in the parameter's place,
// so their state is a shard's size. At each synchronized step the shards
// receive the mean of the ranks' gradients for their piece (reduce-scattered,
// or sliced from the gradients a GradientSynchronizer averaged) and the
// parameters' own gradients are freed; after the optimizer's step the shards
// are all-gathered back into the parameters, so every rank computes with the
// whole model. Collectives run per bucket of parameters of one dtype, each
// rank's pieces of a bucket side by side, so that one bucket is one message.
// Padding stays zero: its gradient is zero, and Adam, AdamW and SGD leave a
// zero with a zero gradient at zero.
class ParameterShards {
 public:
  /// A collective. `gradients_reduced`: the module's gradients arrive
  /// averaged already (ZeRO-1, behind a GradientSynchronizer); otherwise they
  /// are reduce-scattered here (ZeRO-2).
  ParameterShards(ProcessGroup group, torch::nn::Module& module, bool gradients_reduced);

  /// Puts the shards in place of the module's parameters in `optimizer`'s
  /// parameter groups. Throws ConfigError for an optimizer that needs whole
  /// parameters (LBFGS) or that has a state already.
  void shard(torch::optim::Optimizer& optimizer);

  /// A collective: the mean over the ranks of the module's gradients added
  /// to the shards' (a parameter that no rank has a gradient for leaves its
  /// shard's as it was), the shards refreshed from the parameters' values,
  /// and the parameters' gradients freed.
  void reduce_gradients();
  /// A collective: the shards' values into the module's parameters.
  void gather_parameters();
  /// A collective: the 2-norm of the gradients of `shards` (tensors of the
  /// optimizers' groups) over the ranks.
  double gradient_norm(const std::vector<torch::Tensor>& shards);

  /// The tensors of `optimizer`'s groups that are these shards.
  std::vector<torch::Tensor> shards_in(const torch::optim::Optimizer& optimizer) const;
  /// Whether the shards changed since the last reduce_gradients or
  /// gather_parameters: an optimizer stepped them, and no gather followed.
  bool stepped_ungathered() const;
  /// Whether a parameter holds a gradient that reduce_gradients did not
  /// take: a backward pass that no reduction followed.
  bool gradients_pending() const;

  /// A collective: runs `body` (a save) with `optimizer` as an unsharded one:
  /// the module's parameters in its groups and, on rank 0, whole states
  /// gathered from the ranks' shards (the other ranks' are empty: rank 0
  /// alone writes checkpoints); the shards are back in place afterwards.
  void with_whole_state(torch::optim::Optimizer& optimizer, const std::function<void()>& body);
  /// Runs `load` (which loads a whole state) with the module's parameters in
  /// `optimizer`'s groups, then cuts the loaded states to this rank's shards.
  void load_whole_state(torch::optim::Optimizer& optimizer, const std::function<void()>& load);

 private:
  struct Piece {
    torch::Tensor param;  // the module's parameter
    torch::Tensor shard;  // this rank's piece, padded
    int64_t numel = 0, size = 0, offset = 0;  // offset: within its bucket's row
  };
  struct Bucket {
    std::vector<size_t> pieces;
    int64_t row = 0;  // elements of one rank's pieces
  };

  torch::Tensor padded_flat(const torch::Tensor& t, int64_t size) const;
  torch::Tensor own_piece(const Piece& piece, const torch::Tensor& whole) const;
  void reduce_bucket(const Bucket& bucket, std::vector<char>& had);
  void swap_in(torch::optim::Optimizer& optimizer, bool shards);
  int64_t shards_version() const;

  ProcessGroup group_;
  bool gradients_reduced_;
  std::vector<Piece> pieces_;
  std::vector<Bucket> buckets_;
  // shards_version() after the last collective: in-place changes to the
  // shards (an optimizer's step) move their tensors' version counters.
  int64_t version_ = 0;
};

}  // namespace fulgor::detail
