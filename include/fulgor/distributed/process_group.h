#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/export.h"
#include "fulgor/distributed/environment.h"

namespace fulgor {
namespace detail {
struct ProcessGroupAccess;
}

/// How a process group is set up.
struct ProcessGroupOptions {
  /// The c10d backend; empty means the accelerator's distributed_backend().
  std::string backend;
  /// How long the rendezvous and every collective may take before the ranks
  /// waiting on it fail with DistributedError. Lightning's default is 30 minutes;
  /// lower it to notice a dead or stuck peer sooner.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

/// How all_reduce combines the ranks' values.
enum class ReduceOp { sum, mean, max, min };

/// The ranks of one data-parallel job, talking through c10d.
///
/// Contract:
///   - Construction is a collective: every rank of `environment` constructs one
///     with the same backend and options. Rank 0 hosts the rendezvous store (a
///     c10d::TCPStore) at master_addr:master_port; the others connect to it.
///   - Every collective is called by every rank in the same order; tensors are
///     on the device given at construction (all_reduce of a number handles
///     that itself) and of the same shape and dtype on every rank.
///   - A collective that does not complete within the timeout, or whose peer
///     went away, throws DistributedError naming the collective, this rank and
///     the peers; the group is unusable afterwards.
///   - Copies share one group. Not thread-safe: one thread issues collectives.
class FULGOR_API ProcessGroup {
 public:
  /// Joins the job `environment` describes with the backend
  /// options.backend or, when empty, `accelerator.distributed_backend()`;
  /// collectives take tensors on `device`. Throws ConfigError for an unknown
  /// backend (listing the known ones), DistributedError when the rendezvous
  /// fails or times out.
  ProcessGroup(const DistributedEnvironment& environment, const Accelerator& accelerator, torch::Device device,
               ProcessGroupOptions options = {});

  int64_t rank() const;
  int64_t size() const;
  const std::string& backend() const;
  std::chrono::milliseconds timeout() const;
  torch::Device device() const;

  /// Overwrites `tensor` on every rank with rank `root`'s.
  void broadcast(torch::Tensor& tensor, int64_t root = 0);
  /// The same for several tensors, flattened into few messages.
  void broadcast(std::vector<torch::Tensor>& tensors, int64_t root = 0);
  /// Copies every parameter and buffer of `module` (recursively) from rank
  /// `root`, so all ranks start from the same state.
  void broadcast_module(torch::nn::Module& module, int64_t root = 0);
  /// Rank `root`'s `text` (the others' is not read), on every rank: a
  /// decision one rank makes for all, such as a file's name.
  std::string broadcast_text(const std::string& text, int64_t root = 0);

  /// Replaces `tensor` on every rank by the ranks' tensors combined by `op`.
  /// `mean` needs a floating-point tensor.
  void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::sum);
  /// A number (a logged metric) combined over the ranks.
  double all_reduce(double value, ReduceOp op = ReduceOp::mean);

  /// Every rank's `tensor`, in rank order. The tensors have the same shape
  /// and dtype on every rank.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);

  /// On rank `root`, every rank's `tensor` in rank order; elsewhere nothing.
  /// The tensors have the same shape and dtype on every rank.
  std::vector<torch::Tensor> gather(const torch::Tensor& tensor, int64_t root = 0);

  /// Every rank's `input`, side by side in rank order, written into
  /// `output`, as PyTorch's all_gather_into_tensor: `output` is contiguous,
  /// of input's dtype, with size() times its elements.
  void all_gather_into_tensor(torch::Tensor& output, const torch::Tensor& input);

  /// The ranks' `input`s combined by `op`, then cut into size() equal parts,
  /// of which part rank() is written into `output`, as PyTorch's
  /// reduce_scatter_tensor: `output` is contiguous, of input's dtype, with
  /// input's elements divided by size().
  /// On Gloo, which has neither, both are made of its all_to_all through
  /// memory the group keeps for the next call (Note [Collectives Gloo
  /// lacks], src/distributed/process_group.cpp).
  void reduce_scatter_tensor(torch::Tensor& output, const torch::Tensor& input, ReduceOp op = ReduceOp::sum);

  /// Returns once every rank has called barrier.
  void barrier();

  /// A group of the ranks `ranks` (of this group; distinct, ascending), as
  /// PyTorch's torch.distributed.new_group. A collective: every rank calls it,
  /// with the same ranks, in the same order of calls; the members get the
  /// group, numbered 0..ranks.size()-1 in that order, the others nullopt.
  std::optional<ProcessGroup> new_group(const std::vector<int64_t>& ranks);

  struct State;

 private:
  explicit ProcessGroup(std::shared_ptr<State> state);
  friend struct detail::ProcessGroupAccess;
  std::shared_ptr<State> state_;
};

}  // namespace fulgor
