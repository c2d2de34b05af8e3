#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <ostream>

#include "fulgor/core/export.h"
#include "fulgor/distributed/process_group.h"

namespace fulgor {

/// PyTorch's torch.nn.SyncBatchNorm: BatchNorm whose training statistics are
/// those of every rank's batch together.
///
/// Contract:
///   - Takes the place of torch::nn::BatchNorm1d, 2d or 3d: the same options,
///     parameters and buffers (weight, bias, running_mean, running_var,
///     num_batches_tracked, under the same names), any input of shape
///     (N, C, ...) with at least 2 dimensions.
///   - In training mode, when it has a process group of more than one rank,
///     forward is a collective: every rank's mean and variance per channel and
///     its count of values are gathered, and the input is normalized with the
///     mean and the biased variance of all of them; running_mean and
///     running_var are updated with those and the unbiased variance (over all
///     ranks' values). Its backward sums the gradient terms that depend on
///     other ranks' inputs over the ranks (an all_reduce), so the input's
///     gradient is that of one process holding all batches; weight and bias
///     get this rank's share, which data-parallel training averages. Every
///     rank must run the forward and the backward of every SyncBatchNorm in
///     the same order, as with any collective.
///   - Otherwise (evaluation mode, no group, a group of one rank) it computes
///     exactly what torch::nn::BatchNorm does.
///   - Its group is the one set_process_group gave it or, when none was, the
///     process group of the ddp strategy of this process (PyTorch's default
///     group), looked up at each forward.
class FULGOR_API SyncBatchNormImpl : public torch::nn::NormImplBase<1, SyncBatchNormImpl, torch::nn::BatchNormOptions> {
 public:
  explicit SyncBatchNormImpl(int64_t num_features) : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options);

  torch::Tensor forward(const torch::Tensor& input);

  /// Synchronizes over `group` rather than the default one (nullopt: the default).
  void set_process_group(std::optional<ProcessGroup> group);

  void pretty_print(std::ostream& stream) const override;

 protected:
  void _check_input_dim(const torch::Tensor& input) override;

 private:
  friend struct SyncBatchNormConversion;
  std::optional<ProcessGroup> group_;
  /// The BatchNorm convert_sync_batchnorm replaced, which revert_sync_batchnorm puts back.
  std::shared_ptr<torch::nn::Module> replaced_;
};

TORCH_MODULE(SyncBatchNorm);

/// PyTorch's SyncBatchNorm.convert_sync_batchnorm: replaces every
/// torch::nn::BatchNorm1d, 2d and 3d below `module` by a SyncBatchNorm with its
/// options (eps, momentum, affine, track_running_stats), its training mode
/// and a copy of its state (weight and bias with their requires_grad, running
/// statistics, num_batches_tracked), on its device and in its dtype,
/// synchronizing over `group` (nullopt: the default group). Returns how many
/// it replaced. Call it before an optimizer takes the module's parameters.
///
/// A submodule is replaced where `module`'s tree holds it: a module's
/// registered children (Module::replace_module), and the lists of a
/// torch::nn::Sequential and a torch::nn::ModuleDict. LibTorch gives no way to
/// reach a typed member of a module's class (`torch::nn::BatchNorm2d bn;`),
/// which its forward goes on calling, nor the list of a torch::nn::ModuleList:
/// a BatchNorm held so (anywhere besides the tree) is a ConfigError naming
/// it, before anything is replaced. Declare such a layer as
/// fulgor::SyncBatchNorm: it is a BatchNorm outside data-parallel training.
FULGOR_API size_t convert_sync_batchnorm(torch::nn::Module& module, std::optional<ProcessGroup> group = std::nullopt);

/// Undoes convert_sync_batchnorm below `module`: each SyncBatchNorm it made
/// gives its state and mode back to the BatchNorm it replaced, which takes its
/// place again (Lightning's TorchSyncBatchNorm.revert). SyncBatchNorm layers
/// built as such stay. Returns how many it put back.
FULGOR_API size_t revert_sync_batchnorm(torch::nn::Module& module);

}  // namespace fulgor
