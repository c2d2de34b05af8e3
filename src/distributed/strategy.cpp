#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>

#include "config/option_names.h"
#include "distributed/launcher.h"
#include "distributed/parameter_shards.h"
#include "distributed/process_group_state.h"
#include "fulgor/core/error.h"
#include "fulgor/distributed/backend.h"
#include "fulgor/distributed/strategy.h"

namespace fulgor::detail {

bool runs_data_parallel(const std::string& strategy, const DistributedEnvironment& environment) {
  check_strategy(strategy);
  // A "ddp" process started without a launcher is a job of one: it trains
  // alone, like Lightning's ddp on one device.
  return strategy != "single_device" && environment.is_distributed();
}

void check_job_size(const Devices& devices, size_t selected, int64_t num_nodes, const DistributedEnvironment& env) {
  if (num_nodes < 1) throw ConfigError(fmt::format("num_nodes={}: expected 1 or more", num_nodes));
  if (env.source == DistributedEnvironment{}.source) {  // no launcher
    if (num_nodes > 1)
      throw ConfigError(
          fmt::format("num_nodes={}: a job on several nodes needs a launcher that starts the processes "
                      "of every node (torchrun, fulgor-run or srun); this process was started without one",
                      num_nodes));
    return;
  }
  if (num_nodes * env.local_world_size != env.world_size)
    throw ConfigError(
        fmt::format("num_nodes={} with {} processes on this node makes {} processes, but the launcher "
                    "({}) started {}: set num_nodes to the launcher's number of nodes",
                    num_nodes, env.local_world_size, num_nodes * env.local_world_size, env.source, env.world_size));
  if (!devices.is_auto() && static_cast<int64_t>(selected) != env.local_world_size)
    throw ConfigError(fmt::format(
        "devices={} selects {} device{} per node, but the launcher ({}) started {} processes "
        "on this node: set devices={} (or \"auto\") to train on what the launcher started",
        devices.str(), selected, selected == 1 ? "" : "s", env.source, env.local_world_size, env.local_world_size));
}

namespace {

// Note [A device's index] (DeviceSetup::index): LibTorch gives each of a
// CPU-backed accelerator's devices as the one CPU device, so the index comes
// from the `devices` value, read as the default parse_devices reads it.
int64_t index_of(const Accelerator& accelerator, const Devices& devices, torch::Device device, size_t position) {
  if (device.has_index()) return device.index();
  if (accelerator.device_count() <= 1) return 0;
  const Devices chosen = devices.is_auto() ? Devices(accelerator.auto_device_count()) : devices;
  const auto indices = parse_device_indices(chosen, accelerator.device_count(), accelerator.name());
  return indices.at(std::min(position, indices.size() - 1));
}

}  // namespace

namespace {

// Note [One process group per process]
// Every Trainer of a process uses the same group, made by the first: a second
// group would host a second rendezvous store on the same port, which ranks
// still leaving the first one could reach. It lives until the process exits
// (never destroyed, so no collective library is torn down during static
// destruction), like PyTorch's default process group.
std::mutex shared_group_mutex;
ProcessGroup* shared_group_instance = nullptr;

ProcessGroup shared_group(const DistributedEnvironment& environment, const Accelerator& accelerator,
                          torch::Device device, const ProcessGroupOptions& options) {
  std::lock_guard<std::mutex> lock(shared_group_mutex);
  if (!shared_group_instance) shared_group_instance = new ProcessGroup(environment, accelerator, device, options);
  return *shared_group_instance;
}

}  // namespace

std::optional<ProcessGroup> default_process_group() {
  std::lock_guard<std::mutex> lock(shared_group_mutex);
  if (!shared_group_instance) return std::nullopt;
  return *shared_group_instance;
}

Sharding sharding_of(const std::string& strategy, const std::string& sharding_strategy,
                     bool zero_redundancy_optimizer) {
  if (zero_redundancy_optimizer) return Sharding::optimizer_state;
  if (strategy != "fsdp") return Sharding::none;
  const std::string name = sharding_strategy_name(sharding_strategy);
  if (name == "NO_SHARD") return Sharding::none;
  if (name == "HYBRID_SHARD") return Sharding::parameters_within_nodes;
  return name == "FULL_SHARD" ? Sharding::parameters : Sharding::gradients;
}

namespace {

// HYBRID_SHARD's groups, FSDP's intra- and inter-node groups: this node's
// ranks, over which the parameters are sharded, and this rank's peers at the
// same place on the other nodes, over which the pieces are replicated (none
// in a job of one node). Nodes hold consecutive ranks, as torchrun and
// SLURM's default block distribution number them; the ranks check that
// together, so that all of them fail or none. Every rank makes every group,
// in the same order (new_group is a collective).
std::pair<ProcessGroup, std::optional<ProcessGroup>> node_groups(ProcessGroup& world,
                                                                 const DistributedEnvironment& env) {
  const int64_t per_node = env.local_world_size, nodes = world.size() / per_node;
  const bool consecutive = world.size() % per_node == 0 && env.rank == env.node_rank * per_node + env.local_rank;
  if (world.all_reduce(consecutive ? 0.0 : 1.0, ReduceOp::max) > 0)
    throw DistributedError(
        fmt::format("sharding_strategy HYBRID_SHARD shards over each node's ranks, which must be consecutive "
                    "(node n holding ranks n * {0} to n * {0} + {1}, as torchrun and srun's block distribution "
                    "number them), but some rank is not: this one is rank {2} of {3}, local rank {4} on node {5}",
                    per_node, per_node - 1, env.rank, world.size(), env.local_rank, env.node_rank));
  if (nodes == 1) return {world, std::nullopt};
  std::optional<ProcessGroup> node, peers;
  for (int64_t n = 0; n < nodes; ++n) {
    std::vector<int64_t> ranks(static_cast<size_t>(per_node));
    std::iota(ranks.begin(), ranks.end(), n * per_node);
    if (auto group = world.new_group(ranks)) node = std::move(group);
  }
  for (int64_t local = 0; local < per_node; ++local) {
    std::vector<int64_t> ranks;
    for (int64_t n = 0; n < nodes; ++n) ranks.push_back(n * per_node + local);
    if (auto group = world.new_group(ranks)) peers = std::move(group);
  }
  return {std::move(*node), std::move(peers)};
}

// FSDP's MixedPrecision as Lightning's FSDPPrecision makes it of the
// precision: under fsdp's sharding and "bf16-mixed" or "16-mixed", the dtype
// that the units' parameters are gathered in and the gradients reduced in
// (param_dtype and reduce_dtype).
std::optional<torch::ScalarType> mixed_precision_of(Sharding sharding, const Precision& precision) {
  const bool fsdp = sharding == Sharding::gradients || sharding == Sharding::parameters ||
                    sharding == Sharding::parameters_within_nodes;
  if (!fsdp || !precision.mixed) return std::nullopt;
  return precision.dtype;
}

}  // namespace

DataParallelModule attach_data_parallel(ProcessGroup& group, torch::nn::Module& module, Sharding sharding,
                                        const DistributedEnvironment& environment, const Precision& precision) {
  DataParallelModule attached;
  const std::optional<torch::ScalarType> mixed = mixed_precision_of(sharding, precision);
  // Where the gradients are sharded they are reduce-scattered after
  // backward (or after each unit's backward), not all_reduced during it.
  if (sharding == Sharding::none || sharding == Sharding::optimizer_state)
    attached.synchronizer = std::make_unique<GradientSynchronizer>(group, module);
  if (sharding == Sharding::parameters_within_nodes) {
    auto [node, peers] = node_groups(group, environment);
    attached.shards = std::make_unique<ParameterShards>(std::move(node), module, /*gradients_reduced=*/false,
                                                        /*shard_units=*/true, std::move(peers), mixed);
  } else if (sharding != Sharding::none) {
    attached.shards =
        std::make_unique<ParameterShards>(group, module,
                                          /*gradients_reduced=*/attached.synchronizer != nullptr,
                                          /*shard_units=*/sharding == Sharding::parameters, std::nullopt, mixed);
  }
  return attached;
}

std::function<void(torch::Tensor&)> summed_over(ProcessGroup group) {
  return [group](torch::Tensor& tensor) mutable {
    torch::Tensor here = tensor.to(group.device());
    group.all_reduce(here, ReduceOp::sum);
    tensor.copy_(here);
  };
}

DdpStrategy::DdpStrategy(const DistributedEnvironment& environment, const Accelerator& accelerator,
                         torch::Device device, ProcessGroupOptions options, Sharding sharding)
    : environment_(environment), group_(shared_group(environment, accelerator, device, options)), sharding_(sharding) {}

DdpStrategy::~DdpStrategy() = default;

ProcessGroup& DdpStrategy::checkpoint_group() {
  if (!checkpoint_group_) {
    std::vector<int64_t> all(static_cast<size_t>(group_.size()));
    std::iota(all.begin(), all.end(), 0);
    checkpoint_group_ = group_.new_group(all);
  }
  return *checkpoint_group_;
}

void DdpStrategy::attach(torch::nn::Module& module, const Precision& precision) {
  synchronizer_.reset();
  shards_.reset();
  module_ = &module;
  DataParallelModule attached = attach_data_parallel(group_, module, sharding_, environment_, precision);
  synchronizer_ = std::move(attached.synchronizer);
  shards_ = std::move(attached.shards);
}

void DdpStrategy::shard(const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  if (shards_)
    for (const auto& optimizer : optimizers) shards_->shard(*optimizer);
}

void DdpStrategy::after_optimizer_step() {
  if (shards_) shards_->gather_parameters();
}

double DdpStrategy::gradient_norm(const std::vector<torch::Tensor>& params) {
  return shards_->gradient_norm(params);
}

void DdpStrategy::with_whole_state(torch::optim::Optimizer& optimizer, const std::function<void()>& save) {
  if (shards_)
    shards_->with_whole_state(optimizer, save);
  else
    save();
}

void DdpStrategy::load_whole_state(torch::optim::Optimizer& optimizer, const std::function<void()>& load) {
  if (shards_)
    shards_->load_whole_state(optimizer, load);
  else
    load();
}

void DdpStrategy::with_whole_parameters_on_rank_zero(const std::function<void()>& body) {
  if (shards_)
    shards_->with_whole_parameters(body, ParameterShards::Whole::on_rank_zero);
  else
    body();
}

void DdpStrategy::unshard() {
  if (shards_) shards_->unshard_units();
}

void DdpStrategy::detach() {
  // The shards stay until the next attach: the optimizers hold them, and a
  // checkpoint saved after the fit gathers their whole states.
  synchronizer_.reset();
  module_ = nullptr;
}

void DdpStrategy::before_forward(bool sync) {
  synchronized_ = sync;
  if (shards_) shards_->set_synchronizing(sync);
  if (!synchronizer_) return;
  synchronizer_->set_sync(sync);
  synchronizer_->before_forward();
}

void DdpStrategy::after_backward() {
  if (synchronizer_) synchronizer_->finish_backward();
  if (shards_ && synchronized_)
    shards_->reduce_gradients();
  else if (shards_)
    shards_->end_unsynchronized_pass();
}

void DdpStrategy::reduce_gradients() {
  if (synchronizer_) average_gradients();
  if (shards_) shards_->reduce_gradients();
}

void DdpStrategy::average_gradients() {
  // One flat all_reduce. Every rank reduces every parameter, in the same
  // order; one that got no gradient here contributes zeros and, as with the
  // GradientSynchronizer, gets a grad only where the mean is not zero.
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params, flat;
  for (const auto& p : module_->parameters())
    if (p.requires_grad()) {
      params.push_back(p);
      flat.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
    }
  if (params.empty()) return;
  torch::Tensor mean = torch::cat(flat);
  group_.all_reduce(mean, ReduceOp::mean);
  int64_t offset = 0;
  for (auto& p : params) {
    torch::Tensor part = mean.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
    if (p.grad().defined())
      p.mutable_grad().copy_(part);
    else if (part.ne(0).any().item<bool>())
      p.mutable_grad() = part.clone();
  }
}

double DdpStrategy::reduce(double value, Reduce reduce) {
  switch (reduce) {
    case Reduce::mean:
      return group_.all_reduce(value, ReduceOp::mean);
    case Reduce::sum:
      return group_.all_reduce(value, ReduceOp::sum);
    case Reduce::max:
      return group_.all_reduce(value, ReduceOp::max);
    case Reduce::min:
      return group_.all_reduce(value, ReduceOp::min);
  }
  return value;
}

int64_t DdpStrategy::max_over_ranks(int64_t value) {
  return static_cast<int64_t>(group_.all_reduce(static_cast<double>(value), ReduceOp::max));
}

namespace {

class SilencedLogger final : public Logger {
 public:
  explicit SilencedLogger(std::shared_ptr<Logger> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::string version() const override { return inner_->version(); }
  std::string log_dir() const override { return inner_->log_dir(); }
  void log_hyperparams(const nlohmann::json&) override {}
  void log_metrics(const std::map<std::string, double>&, int64_t) override {}
  void finalize(const std::string&) override {}

 private:
  std::shared_ptr<Logger> inner_;
};

}  // namespace

void silence_off_rank_zero(std::vector<std::shared_ptr<Logger>>& loggers, const DistributedEnvironment& environment) {
  if (environment.rank == 0) return;
  for (auto& logger : loggers) logger = std::make_shared<SilencedLogger>(std::move(logger));
}

std::unique_ptr<DdpStrategy> join_ddp(const DistributedEnvironment& environment, const Accelerator& accelerator,
                                      torch::Device device, std::optional<double> ddp_timeout, Sharding sharding) {
  ProcessGroupOptions options;
  if (ddp_timeout) options.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*ddp_timeout * 1000)));
  auto ddp = std::make_unique<DdpStrategy>(environment, accelerator, device, options, sharding);
  ProcessGroupAccess::state(ddp->group()).timeout_option = "ddp_timeout";
  if (launched_ranks()) launched_ranks_joined();
  return ddp;
}

}  // namespace fulgor::detail

// Exported for the tests (Note [Exported symbols] in fulgor/core/export.h).
namespace fulgor::impl {

bool launches_ranks(const std::string& strategy, const DistributedEnvironment& environment,
                    const Accelerator& accelerator, const Devices& devices, size_t selected) {
  if (environment.is_distributed() || selected < 2) return false;
  if (strategy != "single_device") {
    // Refused before any rank starts, rather than by every rank at once.
    const std::string backend = accelerator.distributed_backend();
    if (!has_distributed_backend(backend))
      throw ConfigError(fmt::format(
          "devices={} selects {} devices of accelerator '{}', so strategy '{}' trains on {} processes over its "
          "distributed backend '{}', which is not registered (registered: {}): register it "
          "(REGISTER_DISTRIBUTED_BACKEND), or use devices=1",
          devices.str(), selected, accelerator.name(), strategy, selected, backend,
          fmt::join(distributed_backend_names(), ", ")));
    return true;
  }
  throw ConfigError(fmt::format(
      "devices={} selects {} devices of accelerator '{}', but strategy 'single_device' runs on one device: use "
      "devices=1, or strategy 'auto' or 'ddp' to train on all {} (one process each)",
      devices.str(), selected, accelerator.name(), selected));
}

DeviceSetup device_setup(const Accelerator& accelerator, const Devices& devices,
                         const std::vector<torch::Device>& selected, const DistributedEnvironment& environment) {
  const auto local_rank = static_cast<size_t>(environment.local_rank);
  const bool shared = !selected.empty() && std::all_of(selected.begin(), selected.end(),
                                                       [&](const torch::Device& d) { return d == selected.front(); });
  if (local_rank >= selected.size() && !shared)
    throw ConfigError(fmt::format(
        "devices={} selects {} devices of accelerator '{}', but this is local rank {} of {} processes on this "
        "node (from {}): select at least one device per process",
        devices.str(), selected.size(), accelerator.name(), environment.local_rank, environment.local_world_size,
        environment.source));
  const size_t position = local_rank < selected.size() ? local_rank : 0;
  DeviceSetup setup{selected[position]};
  setup.index = detail::index_of(accelerator, devices, setup.device, position);
  setup.local_rank = environment.local_rank;
  setup.local_world_size = environment.local_world_size;
  setup.rank = environment.rank;
  setup.world_size = environment.world_size;
  return setup;
}

}  // namespace fulgor::impl
