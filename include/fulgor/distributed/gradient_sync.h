#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/distributed/process_group.h"

namespace fulgor {

/// How gradients are synchronized.
struct GradientSyncOptions {
  /// Gradients travel in buckets of about this many MiB; a bucket's all_reduce
  /// starts as soon as backward has produced all its gradients. The first
  /// bucket holds at most 1 MiB so communication starts early. PyTorch's default.
  double bucket_cap_mb = 25;
  /// Whether before_forward() copies the buffers (e.g. batch-norm statistics)
  /// from rank 0 on synchronized steps, as PyTorch's DDP does.
  bool broadcast_buffers = true;
};

// Note [Gradient buckets]
// c10d's Reducer, the engine of PyTorch's DistributedDataParallel, cannot be
// used from C++ with LibTorch 1.13 as packaged (reducer.hpp includes the
// distributed-autograd headers, which are not installed), so fulgor does what
// it does with c10d's public collectives: parameters are grouped into buckets
// in reverse order (backward produces the last layers' gradients first), each
// of one dtype and device; a post hook on every parameter's gradient
// accumulator counts the bucket's gradients, and the bucket whose last gradient
// arrived is flattened, divided by the world size and all_reduced
// asynchronously while backward goes on. Buckets are launched strictly in
// order, so every rank issues the same sequence of collectives.
// finish_backward() waits for them and writes the means back into the grads.

// Note [A parameter's storage replaced]
// Tensor::set_ (a checkpoint load taking the saved storage, Note [Loading
// without a copy] in checkpoint.cpp) gives a parameter a new gradient
// accumulator; a hook on the old one is never called again, and a backward
// pass would leave that gradient local to its rank. So each synchronized
// finish_backward() checks every parameter's accumulator against the hooked
// one and moves the hook to the new one. The pass's gradients are reduced all
// the same: a bucket that did not launch during backward is launched then,
// from the grads.

// Note [Ranks in step]
// Data parallel training is only right while every rank holds the same
// parameters, and a rank that drifts apart trains on silently. A fingerprint
// of each parameter's bits (sums of its elements' bit patterns as integers,
// plain and weighted by position: independent of the order of summation, so
// equal bits give equal fingerprints on every rank) is compared over the
// ranks with a max and a min all_reduce: check_in_step() compares the
// parameters now, and the first synchronized step after construction or
// after check_next_step() compares the averaged gradients, which are equal
// on every rank exactly when the synchronization reached every parameter.

/// Averages a module's gradients over the ranks of a process group during the
/// backward pass, overlapping communication with the rest of backward (see
/// Note [Gradient buckets]).
///
/// Contract:
///   - Construction is a collective. It checks that every rank's module has
///     the same number of parameters and element count (else DistributedError), then
///     copies rank 0's parameters and buffers to every rank.
///   - Each training step: before_forward(), forward, backward(loss). When
///     backward returns, every parameter's grad holds the mean over the ranks
///     of the gradients accumulated since the last synchronized step, and the
///     optimizer may step. Code that runs loss.backward() itself (a precision
///     plugin scaling the loss) calls finish_backward() before the optimizer step.
///   - All ranks synchronize on the same steps. A parameter that got no
///     gradient on a rank contributes zeros; its grad is set only where the
///     mean is non-zero or it had a gradient, so parameters no rank used keep none.
///   - With sync off (set_sync(false) or a no_sync() guard) backward only
///     accumulates local gradients, without any communication: gradient
///     accumulation uses this for the micro-batches that do not step the optimizer.
///   - A failed or timed-out reduction throws DistributedError from backward()
///     or finish_backward(); the synchronizer and its group are unusable afterwards.
///   - The module must outlive the synchronizer; its parameters must stay
///     the module's tensors (Accelerator::move_module and checkpoint loads
///     keep them; their storage may change, Note [A parameter's storage replaced]).
///   - The first synchronized step, and the first after check_next_step(),
///     throw DistributedError when the averaged gradients differ across the
///     ranks (Note [Ranks in step]).
class FULGOR_API GradientSynchronizer {
 public:
  GradientSynchronizer(ProcessGroup group, torch::nn::Module& module, GradientSyncOptions options = {});
  ~GradientSynchronizer();
  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  /// Broadcasts buffers from rank 0 when options.broadcast_buffers and sync is on.
  void before_forward();
  /// loss.backward(), then finish_backward().
  void backward(const torch::Tensor& loss);
  /// Waits for the buckets' all_reduces of the last backward pass and writes
  /// the means into the grads; does nothing when that pass did not synchronize.
  void finish_backward();

  /// A collective: throws DistributedError naming `when` and the first
  /// parameter that differs when the ranks' parameters are not bit-equal.
  void check_in_step(const std::string& when);
  /// The next synchronized step compares the averaged gradients across the
  /// ranks (a collective of that step), naming `when` if they differ.
  void check_next_step(const std::string& when);

  /// Whether a synchronized backward pass produced gradients that
  /// finish_backward() has not averaged yet.
  bool pending() const;

  /// Whether backward passes synchronize (initially true).
  bool sync() const;
  void set_sync(bool sync);

  /// Turns synchronization off for its lifetime, then restores it.
  class NoSync {
   public:
    explicit NoSync(GradientSynchronizer& owner) : owner_(owner), previous_(owner.sync()) { owner_.set_sync(false); }
    ~NoSync() { owner_.set_sync(previous_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    GradientSynchronizer& owner_;
    bool previous_;
  };
  /// `auto guard = synchronizer.no_sync();` — local accumulation until the guard ends.
  NoSync no_sync() { return NoSync(*this); }

  /// How many buckets the parameters form.
  int64_t bucket_count() const;
  /// How many bucket all_reduces have been started so far (for logs and tests).
  int64_t reductions_started() const;
  const ProcessGroup& group() const { return group_; }

 private:
  struct Impl;
  ProcessGroup group_;
  GradientSyncOptions options_;
  std::vector<torch::Tensor> buffers_;
  torch::nn::Module* module_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fulgor
