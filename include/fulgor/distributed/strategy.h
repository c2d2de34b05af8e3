#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/config/trainer_options.h"
#include "fulgor/core/accelerator.h"
#include "fulgor/core/export.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/distributed/gradient_sync.h"
#include "fulgor/distributed/process_group.h"
#include "fulgor/loggers/logger.h"
#include "fulgor/module.h"
#include "fulgor/precision/precision.h"

// Exported for the tests (Note [Exported symbols] in fulgor/core/export.h).
namespace fulgor::impl {

/// Whether a Trainer with `strategy` starts the ranks of a job itself (Note
/// [The Trainer's own launcher]): its devices select more than one device, in
/// a process no launcher started, and the strategy is "auto" or "ddp", as
/// Lightning's "auto" becomes "ddp" with its subprocess script launcher.
/// Throws ConfigError for "single_device" with more than one device, and when
/// the accelerator's distributed backend is not registered.
FULGOR_API bool launches_ranks(const std::string& strategy, const DistributedEnvironment& environment,
                               const Accelerator& accelerator, const Devices& devices, size_t selected);

/// The device this process trains on, and what setup_device is told of it:
/// `selected[local_rank]` of the devices `devices` selected. A selection of
/// one device that processes share (the CPU: every entry is the same device)
/// serves every local rank. Throws ConfigError when the selection has too few
/// devices for the processes of this node.
FULGOR_API DeviceSetup device_setup(const Accelerator& accelerator, const Devices& devices,
                                    const std::vector<torch::Device>& selected,
                                    const DistributedEnvironment& environment);

}  // namespace fulgor::impl

namespace fulgor::detail {

class ParameterShards;

/// What a data-parallel strategy shards over the ranks (Note [Parameter
/// shards] in src/distributed/parameter_shards.h).
enum class Sharding {
  none,                     // ddp, and fsdp's NO_SHARD
  optimizer_state,          // ZeRO-1: ddp's zero_redundancy_optimizer
  gradients,                // ZeRO-2, fsdp's SHARD_GRAD_OP: the gradients and the optimizer state
  parameters,               // ZeRO-3, fsdp's FULL_SHARD: and the parameters of the fulgor::Sharded units
  parameters_within_nodes,  // fsdp's HYBRID_SHARD: FULL_SHARD over each node's ranks, replicated across nodes
};

/// The sharding that the options `strategy`, `sharding_strategy` and
/// `zero_redundancy_optimizer` ask for (the Trainer's and Fabric's fields of
/// those names), checked as check_options does.
Sharding sharding_of(const std::string& strategy, const std::string& sharding_strategy, bool zero_redundancy_optimizer);

/// What a data-parallel strategy keeps for a module it trains: DdpStrategy's
/// for its module, Fabric's for each module it set up.
struct DataParallelModule {
  std::unique_ptr<GradientSynchronizer> synchronizer;  // none where the gradients are sharded
  std::unique_ptr<ParameterShards> shards;             // under sharding
};

/// A collective: starts gradient synchronization for `module` over `group`
/// (rank 0's parameters and buffers copied to every rank) and, with
/// `sharding`, cuts its parameters' shards, in `precision`'s dtype where fsdp
/// mixes precisions (Note [Sharded mixed precision] in
/// src/distributed/parameter_shards.h). Under
/// Sharding::parameters_within_nodes the nodes are `environment`'s, each
/// holding consecutive ranks (DistributedError otherwise, on every rank).
DataParallelModule attach_data_parallel(ProcessGroup& group, torch::nn::Module& module, Sharding sharding,
                                        const DistributedEnvironment& environment, const Precision& precision);

/// A tensor summed over `group`'s ranks in place (a collective at each
/// call): what a GradScaler under a sharded strategy combines its count of
/// non-finite gradients with (GradScaler::set_found_inf_reduction).
std::function<void(torch::Tensor&)> summed_over(ProcessGroup group);

/// Whether `strategy` ("auto", "single_device", "ddp" or "fsdp") runs
/// data-parallel in the job `environment` describes: "ddp" and "fsdp" when
/// the job has more than one process, and "auto" likewise.
bool runs_data_parallel(const std::string& strategy, const DistributedEnvironment& environment);

/// The process group the ddp strategy made in this process (Note [One
/// process group per process]), nullopt before any: the group a SyncBatchNorm
/// without one of its own synchronizes over, as PyTorch's default group.
std::optional<ProcessGroup> default_process_group();

using impl::device_setup;
using impl::launches_ranks;

/// Lightning's cluster environments' validate_settings: the job a launcher
/// started must be as large as `num_nodes` and `devices` make it, num_nodes
/// times the devices of a node (`selected` of them; the launcher's processes
/// per node where devices is "auto"); a process started without a launcher
/// is a job of one node. Throws ConfigError naming both numbers otherwise.
void check_job_size(const Devices& devices, size_t selected, int64_t num_nodes, const DistributedEnvironment& env);

/// Strategies "ddp" and "fsdp": one process per device, joined in a c10d
/// process group, the gradients averaged over the ranks, and with `sharding`
/// the optimizers' state (and the gradients) sharded.
///
/// Contract:
///   - The first construction in a process is a collective over the job's
///     ranks: it makes the process group with the accelerator's
///     distributed_backend() and `options`, which later ones share (see Note
///     [One process group per process]). One per Trainer, kept across its loops.
///   - attach() starts gradient synchronization for a module, copying rank 0's
///     parameters and buffers to every rank; detach() ends it. With sharding,
///     shard() then puts the optimizers on the shards, and after each
///     optimizer step after_optimizer_step() gathers the parameters; the
///     optimizers keep the shards after detach(), until the next attach().
///     Under Sharding::parameters and parameters_within_nodes, unshard()
///     gathers the units' parameters for good at the end of a fit; a fit
///     that fails leaves them released.
///   - Each training batch: before_forward(sync), forward, the backward pass,
///     after_backward().
///     With sync false the gradients only accumulate locally, without any
///     communication; before an optimizer step on gradients of such passes
///     alone, reduce_gradients().
///   - Every other member is a collective too: all ranks call it in the same
///     order. A peer that fails or does not answer within the timeout makes it
///     throw DistributedError naming this rank and the peer.
class DdpStrategy {
 public:
  DdpStrategy(const DistributedEnvironment& environment, const Accelerator& accelerator, torch::Device device,
              ProcessGroupOptions options = {}, Sharding sharding = Sharding::none);
  ~DdpStrategy();

  const DistributedEnvironment& environment() const { return environment_; }
  bool is_global_zero() const { return environment_.rank == 0; }
  ProcessGroup& group() { return group_; }
  /// A group of the same ranks for the collectives of a checkpoint saved on
  /// a thread of its own while training goes on over group(); made at the
  /// first call, which is a collective.
  ProcessGroup& checkpoint_group();

  Sharding sharding() const { return sharding_; }
  /// The shards of the attached module under sharding, else null.
  const ParameterShards* shards() const { return shards_.get(); }

  /// `precision`: the fit's, for fsdp's mixed precision.
  void attach(torch::nn::Module& module, const Precision& precision);
  /// Under sharding: `optimizers` step the shards (ConfigError for one that
  /// cannot, Note [Parameter shards]).
  void shard(const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers);
  void detach();
  /// Under Sharding::parameters, the units' parameters gathered for good.
  void unshard();
  void before_forward(bool sync);
  /// Waits for the gradients' averaging that the backward pass began.
  void after_backward();
  /// Averages the gradients over the ranks now (a window that ended without
  /// a synchronized backward pass).
  void reduce_gradients();
  /// Under sharding, the shards' values into the parameters.
  void after_optimizer_step();
  /// Under sharding: the 2-norm over the ranks of the gradients of `params`
  /// (an optimizer's shards).
  double gradient_norm(const std::vector<torch::Tensor>& params);
  /// Runs `save` with `optimizer` holding whole parameters and states (a
  /// collective under sharding; the states are whole on rank 0 only).
  void with_whole_state(torch::optim::Optimizer& optimizer, const std::function<void()>& save);
  /// Runs `load` of a whole state into `optimizer`, then shards it.
  void load_whole_state(torch::optim::Optimizer& optimizer, const std::function<void()>& load);
  /// Runs `body` (a save, which rank 0 writes) with the module's parameters
  /// whole on rank 0 (a collective under Sharding::parameters, in which the
  /// other ranks send their pieces).
  void with_whole_parameters_on_rank_zero(const std::function<void()>& body);
  /// A logged value combined over the ranks.
  double reduce(double value, Reduce reduce);
  /// The largest of the ranks' values: the ranks agree on whether to stop
  /// (a stop request or a signal that reached some ranks only).
  int64_t max_over_ranks(int64_t value);
  void barrier() { group_.barrier(); }

 private:
  DistributedEnvironment environment_;
  ProcessGroup group_;
  std::optional<ProcessGroup> checkpoint_group_;
  void average_gradients();

  Sharding sharding_;
  torch::nn::Module* module_ = nullptr;
  std::unique_ptr<GradientSynchronizer> synchronizer_;  // none where the gradients are sharded
  std::unique_ptr<ParameterShards> shards_;
  bool synchronized_ = true;  // whether the current backward pass synchronizes
};

/// Strategy "ddp" for this process: joins the job (a collective, Note [One
/// process group per process]) with `ddp_timeout` seconds for each collective
/// (Lightning's default where nullopt), and tells the ranks this process
/// started itself that the job has met (Note [The Trainer's own launcher]).
std::unique_ptr<DdpStrategy> join_ddp(const DistributedEnvironment& environment, const Accelerator& accelerator,
                                      torch::Device device, std::optional<double> ddp_timeout,
                                      Sharding sharding = Sharding::none);

/// Off rank 0, each of `loggers` replaced by one that writes nothing (only
/// rank 0 logs, as in Lightning).
void silence_off_rank_zero(std::vector<std::shared_ptr<Logger>>& loggers, const DistributedEnvironment& environment);

}  // namespace fulgor::detail
