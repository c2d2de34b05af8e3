#pragma once

// The parameters' shards of the sharded strategies (ZeRO-1, ZeRO-2 and,
// for the units of fulgor::Sharded, ZeRO-3).

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "distributed/working_memory.h"
#include "fulgor/distributed/process_group.h"
#include "fulgor/distributed/sharded_unit.h"

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
// rank's pieces of a bucket side by side, so that one bucket is one message
// (a parameter larger than a bucket is cut into several); the messages are
// assembled in one buffer that each reuses.
// Padding stays zero: its gradient is zero, and Adam, AdamW and SGD leave a
// zero with a zero gradient at zero.
//
// Note [Fully sharded units]
// Under FULL_SHARD (ZeRO-3) the parameters of each fulgor::Sharded unit are
// not kept whole: their storage is released (shapes, names and the tensors
// themselves stay, so that autograd's saved tensors and the module's members
// keep pointing at them) and they are gathered only while needed, in FSDP2's
// steps:
//   - forward: gather (allocate, all-gather the unit's buckets, copy in),
//     the unit's forward, release. The unit's tensor inputs go through
//     AfterUnitBackward and its outputs through BeforeUnitBackward, two
//     identity autograd functions (src/distributed/sharded_unit.cpp): C++
//     modules have no hooks, and these are where backward tells the unit.
//   - backward: BeforeUnitBackward gathers again before autograd computes
//     the unit's gradients (the saved tensors alias the parameters'
//     storage, so they see the gathered values); AfterUnitBackward, which
//     autograd runs once the gradients of the unit's inputs are done (its
//     parameters' accumulations run first: they have the highest priority),
//     reduce-scatters the unit's gradients into the pieces and releases the
//     parameters and their gradients. A unit used twice reduces after its
//     last backward. A unit that checkpoints its activations runs its
//     forward again between the two (Note [Checkpointed units]).
//   - after backward: the units whose AfterUnitBackward did not run (the
//     first unit, whose inputs need no gradient) are reduced then, with the
//     parameters outside any unit, as under SHARD_GRAD_OP.
// Parameters outside every unit stay whole, as under SHARD_GRAD_OP. The
// copy into a gathered parameter does not move its version counter, which
// autograd checks its saved tensors against. A unit made with
// reshard_after_forward false keeps its parameters gathered from its forward
// to the end of its backward (FSDP2's option of that name): one all-gather
// a step instead of two, for the memory of the unit's parameters.
//
// Note [Sharded mixed precision]
// FSDP's MixedPrecision(param_dtype, reduce_dtype), one dtype for both as
// Lightning's FSDPPrecision sets them ("bf16-mixed": bfloat16, "16-mixed":
// float16). A unit's parameters are gathered for its passes in that dtype:
// each parameter is switched (set_data) to a tensor of it, `low`, whose
// storage is gathered into and released in place as a full-precision
// parameter's is (autograd's saved views of it see the values gathered
// again in backward), and back to `full`, its own full-precision tensor,
// when released; the unit's floating-point inputs are cast to it (FSDP's
// cast_forward_inputs), so that its forward computes in it. Its gradients
// come in that dtype; a pass that does not synchronize keeps them in full
// precision. Every gradient (a unit's, or one outside the units) is
// reduce-scattered in that dtype and added to the piece's full-precision
// gradient, which the optimizer steps with the full-precision pieces. A
// checkpoint, and the end of the fit, gather in full precision.
//
// Note [Replicated shards]
// Under HYBRID_SHARD the pieces are cut among the ranks of one node (the
// group), and every node holds the same pieces: each reduced piece of a
// gradient, the mean over the node's ranks, is averaged again over the
// ranks that hold the same piece on the other nodes (the replicas), which
// makes it the mean over all ranks, as FSDP1's HYBRID_SHARD reduces. The
// collectives of a step run within the node but for that one all_reduce per
// bucket. The first node alone gathers what rank 0 writes (a full
// checkpoint); every node offers its pieces to a sharded one, whose plan
// has one rank write each (Note [Saving a distributed checkpoint]).
class ParameterShards {
 public:
  /// A collective. `gradients_reduced`: the module's gradients arrive
  /// averaged already (ZeRO-1, behind a GradientSynchronizer); otherwise they
  /// are reduce-scattered here (ZeRO-2).
  /// `shard_units`: the parameters of the module's fulgor::Sharded units are
  /// released and gathered only for their passes (Note [Fully sharded
  /// units]); throws ConfigError for a parameter that shares its storage.
  /// `replicas` (HYBRID_SHARD, Note [Replicated shards]): the ranks that hold
  /// the same pieces as this one, among which the reduced gradients are
  /// averaged again; `group` is then the ranks among which the pieces are
  /// cut.
  /// `mixed`: the dtype of Note [Sharded mixed precision], if any.
  ParameterShards(ProcessGroup group, torch::nn::Module& module, bool gradients_reduced, bool shard_units = false,
                  std::optional<ProcessGroup> replicas = std::nullopt,
                  std::optional<torch::ScalarType> mixed = std::nullopt);
  ~ParameterShards();
  ParameterShards(const ParameterShards&) = delete;
  ParameterShards& operator=(const ParameterShards&) = delete;

  /// Puts the shards in place of the module's parameters in `optimizer`'s
  /// parameter groups. Throws ConfigError for an optimizer that needs whole
  /// parameters (LBFGS) or that has a state already.
  void shard(torch::optim::Optimizer& optimizer);

  /// A collective: the mean over the ranks of the module's gradients added
  /// to the shards' (a parameter that no rank has a gradient for leaves its
  /// shard's as it was), the shards refreshed from the parameters' values,
  /// and the parameters' gradients freed.
  void reduce_gradients();
  /// A collective: the shards' values into the module's parameters (those
  /// outside the units: a unit gathers its own when it runs).
  void gather_parameters();
  /// Whether the backward passes to come reduce their gradients (false in
  /// passes that accumulate: no_backward_sync). The units read it.
  void set_synchronizing(bool synchronizing) { synchronizing_ = synchronizing; }
  /// After a backward pass that did not synchronize: the units' parameters
  /// released, their gradients kept.
  void end_unsynchronized_pass();
  /// For whom with_whole_parameters gathers the units' parameters: rank 0
  /// alone (a save, which rank 0 writes: the other ranks send their pieces
  /// and hold nothing more), or every rank, what `body` writes into them
  /// then cut back into the pieces (a load). Lightning's FSDP strategies
  /// save and load full state dicts so (FullStateDictConfig's rank0_only
  /// true, then false).
  enum class Whole { on_rank_zero, on_every_rank };
  /// A collective: runs `body` with every unit's parameters whole where
  /// `whole` says.
  void with_whole_parameters(const std::function<void()>& body, Whole whole);
  /// A collective: the units' parameters gathered for good and the units
  /// no longer sharded (the end of a fit).
  void unshard_units();
  /// A collective: the 2-norm of the gradients of `shards` (tensors of the
  /// optimizers' groups) over the ranks.
  double gradient_norm(const std::vector<torch::Tensor>& shards);

  /// The tensors of `optimizer`'s groups that are these shards.
  std::vector<torch::Tensor> shards_in(const torch::optim::Optimizer& optimizer) const;
  /// Where this rank's piece of a parameter lies: the elements [begin, end)
  /// of the parameter's flattened values, which the shard's first end - begin
  /// elements hold (the rest is padding; none past the parameter's end).
  /// `released`: the parameter holds no values now (a FULL_SHARD unit's
  /// between its passes), the shard alone does.
  struct Place {
    torch::Tensor param, shard;
    int64_t begin = 0, end = 0;
    bool released = false;
  };
  /// The place of the piece whose parameter or shard `tensor` is; nullopt for
  /// a tensor that is neither.
  std::optional<Place> place_of(const torch::Tensor& tensor) const;
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
  friend class UnitSharding;
  struct Piece {
    torch::Tensor param;  // the module's parameter
    torch::Tensor shard;  // this rank's piece, padded
    torch::Tensor full, low;                  // a unit's parameter's tensors under mixed precision
    int64_t numel = 0, size = 0, offset = 0;  // offset: within its bucket's row
    int64_t unit = -1;                        // the unit whose parameter it is, or -1
  };
  struct Bucket {
    std::vector<size_t> pieces;
    int64_t row = 0;  // elements of one rank's pieces
    int64_t unit = -1;
  };
  struct Unit {
    std::weak_ptr<ShardedUnit> module;
    std::shared_ptr<UnitSharding> handle;
    std::vector<size_t> buckets;
    bool reshard_after_forward = true;
    bool gathered = true, reduced = false;
    bool low = false;                     // gathered in the mixed-precision dtype
    int64_t forwards = 0, backwards = 0;  // passes since the last reduction
  };

  // What a unit's parameters are gathered for: its passes (in the
  // mixed-precision dtype, if any), or whole, on every rank or on rank 0.
  enum class For { passes, every_rank, rank_zero };
  void find_units(torch::nn::Module& module);
  void gather_bucket(const Bucket& bucket, bool to_rank_zero, bool low);
  void gather_unit(size_t unit, For purpose);
  void release_unit(size_t unit);
  void reduce_unit(size_t unit);
  void detach_units();

  // The elements [begin, end) of the piece's parameter, flattened, that this
  // rank holds (Place's).
  std::pair<int64_t, int64_t> bounds(const Piece& piece) const;
  // This rank's piece of `whole` (the parameter or a tensor of its shape),
  // padded with zeros to the piece's size.
  torch::Tensor own_piece(const Piece& piece, const torch::Tensor& whole) const;
  void reduce_bucket(const Bucket& bucket, std::vector<char>& had);
  template <typename Body>
  void for_pieces_in(const Bucket& bucket, int64_t first, int64_t begin, int64_t end, Body body);
  template <typename Body>
  void in_messages(int64_t width, int64_t first, torch::ScalarType dtype, Body body);
  void swap_in(torch::optim::Optimizer& optimizer, bool shards);
  int64_t shards_version() const;

  // Whether this rank's node is the first of the ranks holding its pieces
  // (always, but under HYBRID_SHARD).
  bool first_replica() const { return !replicas_ || replicas_->rank() == 0; }
  // This rank in the job, as messages name it: under HYBRID_SHARD `group_`
  // is its node's, whose ranks are consecutive.
  int64_t rank() const { return (replicas_ ? replicas_->rank() * group_.size() : 0) + group_.rank(); }

  ProcessGroup group_;
  std::optional<ProcessGroup> replicas_;
  std::optional<torch::ScalarType> mixed_;
  bool gradients_reduced_;
  bool synchronizing_ = true;
  std::vector<Piece> pieces_;
  std::vector<Bucket> buckets_;
  std::vector<Unit> units_;
  // A message's rows of every rank and this rank's row, for a bucket's
  // reduction and its gathering: one buffer the size of the largest message.
  WorkingMemory working_;
  // shards_version() after the last collective: in-place changes to the
  // shards (an optimizer's step) move their tensors' version counters.
  int64_t version_ = 0;
};

/// What a fulgor::Sharded unit calls during its passes (Note [Fully sharded
/// units]). The autograd graph may outlive the strategy: a pass after it
/// ended throws Error.
class UnitSharding {
 public:
  UnitSharding(ParameterShards* shards, size_t unit) : shards_(shards), unit_(unit) {}

  void forward_begins();
  /// `routed`: whether backward will call backward_begins first.
  void forward_ends(bool routed);
  void backward_begins();
  void backward_ends();
  /// The dtype the unit computes in (Note [Sharded mixed precision]), if
  /// not its parameters'.
  std::optional<torch::ScalarType> compute_dtype() const { return shards().mixed_; }

 private:
  friend class ParameterShards;
  ParameterShards& shards() const;
  ParameterShards* shards_;
  size_t unit_;
};

}  // namespace fulgor::detail
