#include "fulgor/fabric/fabric.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "config/option_names.h"
#include "distributed/launcher.h"
#include "fulgor/config/seed.h"
#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fulgor/distributed/gradient_sync.h"
#include "fulgor/distributed/strategy.h"

namespace fulgor {

BackwardSyncGuard::BackwardSyncGuard(GradientSynchronizer* synchronizer, bool enabled)
    : synchronizer_(enabled ? synchronizer : nullptr) {
  if (!synchronizer_) return;
  previous_ = synchronizer_->sync();
  synchronizer_->set_sync(false);
}

BackwardSyncGuard::~BackwardSyncGuard() {
  if (synchronizer_) synchronizer_->set_sync(previous_);
}

Fabric::Fabric(FabricOptions options)
    : options_(std::move(options)), accelerator_(make_accelerator(options_.accelerator)) {
  detail::check_strategy(options_.strategy);
  if (options_.num_nodes < 1) throw ConfigError(fmt::format("num_nodes={}: expected 1 or more", options_.num_nodes));
  precision_ = Precision::parse(options_.precision, *accelerator_);
  selected_ = accelerator_->parse_devices(options_.devices);
  environment_ = detect_distributed_environment();
  if (options_.num_nodes > 1 && !environment_.is_distributed())
    throw ConfigError(
        fmt::format("num_nodes={} needs a launcher on every node (torchrun, fulgor-run or srun); this "
                    "process was started without one",
                    options_.num_nodes));
  if (environment_.is_distributed() && environment_.world_size != options_.num_nodes * environment_.local_world_size)
    throw ConfigError(fmt::format(
        "num_nodes={} with {} processes per node makes {} processes, but {} started {}: give the launcher's "
        "number of nodes",
        options_.num_nodes, environment_.local_world_size, options_.num_nodes * environment_.local_world_size,
        environment_.source, environment_.world_size));
  // Refuses "single_device" with several devices, as the Trainer does.
  const bool launches =
      detail::launches_ranks(options_.strategy, environment_, *accelerator_, options_.devices, selected_.size());
  strategy_ = launches || detail::runs_data_parallel(options_.strategy, environment_) ? "ddp" : "single_device";
  device_setup_ = detail::device_setup(*accelerator_, options_.devices, selected_, environment_);
  loggers_ = options_.loggers;
}

Fabric::~Fabric() {
  synchronizers_.clear();
  if (launched_) accelerator_->teardown();
}

void Fabric::launch() {
  if (launched_) throw Error("Fabric::launch() was called already: call it once");
  if (detail::launches_ranks(options_.strategy, environment_, *accelerator_, options_.devices, selected_.size()))
    environment_ = detail::launch_ranks(static_cast<int64_t>(selected_.size()));
  device_setup_ = detail::device_setup(*accelerator_, options_.devices, selected_, environment_);
  accelerator_->setup_device(device_setup_);
  if (strategy_ == "ddp") {
    ProcessGroupOptions group_options;
    if (options_.ddp_timeout)
      group_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*options_.ddp_timeout * 1000)));
    // The Trainer's group (Note [One process group per process]), so that a
    // Fabric and Trainers of one program share it.
    detail::DdpStrategy ddp(environment_, *accelerator_, device_setup_.device, group_options);
    group_ = std::make_unique<ProcessGroup>(ddp.group());
    if (detail::launched_ranks()) detail::launched_ranks_joined();
    if (!is_global_zero())
      for (auto& logger : loggers_) logger = detail::silenced_logger(logger);
  }
  if (precision_.needs_grad_scaler()) scaler_ = std::make_unique<GradScaler>();
  launched_ = true;
}

// Lightning's _validate_launched: one process may skip launch().
void Fabric::require_launched(const char* what) const {
  if (launched_) return;
  if (strategy_ == "ddp")
    throw Error(
        fmt::format("Fabric::{} needs the job's processes: call fabric.launch() first ({} processes, "
                    "strategy 'ddp')",
                    what, std::max<size_t>(selected_.size(), static_cast<size_t>(environment_.world_size))));
  const_cast<Fabric*>(this)->launch();
}

ProcessGroup& Fabric::group() { return *group_; }

DistributedShard Fabric::shard() const {
  DistributedShard shard;
  shard.num_replicas = world_size();
  shard.rank = global_rank();
  return shard;
}

void Fabric::setup_module(torch::nn::Module& module) {
  require_launched("setup");
  if (std::find(modules_.begin(), modules_.end(), &module) != modules_.end())
    throw ConfigError(fmt::format("the module '{}' was set up already: set up each module once", module.name()));
  precision_.convert_module(module);
  accelerator_->move_module(module, device());
  if (group_) synchronizers_.push_back(std::make_unique<GradientSynchronizer>(*group_, module));
  modules_.push_back(&module);
}

FabricOptimizer Fabric::setup_optimizer(torch::optim::Optimizer& optimizer) {
  require_launched("setup");
  if (std::find(optimizers_.begin(), optimizers_.end(), &optimizer) != optimizers_.end())
    throw ConfigError("an optimizer was set up already: set up each optimizer once");
  optimizers_.push_back(&optimizer);
  return FabricOptimizer(*this, optimizer);
}

void Fabric::to_device(torch::nn::Module& module) const { accelerator_->move_module(module, device()); }

GradientSynchronizer* Fabric::synchronizer_of(const torch::nn::Module& module) const {
  const auto it = std::find(modules_.begin(), modules_.end(), &module);
  if (it == modules_.end())
    throw ConfigError(fmt::format(
        "the module '{}' was not set up: call fabric.setup(module, ...) before no_backward_sync", module.name()));
  return synchronizers_.empty() ? nullptr : synchronizers_[static_cast<size_t>(it - modules_.begin())].get();
}

BackwardSyncGuard Fabric::no_backward_sync(torch::nn::Module& module, bool enabled) {
  return BackwardSyncGuard(synchronizer_of(module), enabled);
}

// Note [Buffers under Fabric's ddp]
// PyTorch's DDP copies rank 0's buffers (batch-norm statistics) to every rank
// before each synchronized forward pass, which it sees because the module is
// its wrapper. Fabric does not wrap the forward pass, so it copies them after
// a synchronized backward pass instead: the next forward pass starts from the
// same buffers as under DDP; only the buffers after the last step differ
// (rank 0's on every rank, where DDP leaves each rank's own).
void Fabric::backward(const torch::Tensor& loss) {
  (scaler_ ? scaler_->scale(loss) : loss).backward();
  for (auto& synchronizer : synchronizers_) {
    synchronizer->finish_backward();
    synchronizer->before_forward();
  }
}

bool Fabric::step(torch::optim::Optimizer& optimizer) {
  if (!scaler_) {
    optimizer.step();
    return true;
  }
  const bool stepped = scaler_->step(optimizer);
  scaler_->update();
  return stepped;
}

std::optional<double> Fabric::clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                             const ClipGradients& how) {
  if (how.clip_val.has_value() == how.max_norm.has_value())
    throw ConfigError(how.clip_val ? "clip_gradients: both clip_val and max_norm are set; set one of them"
                                   : "clip_gradients: set clip_val or max_norm to clip gradients");
  if (scaler_) scaler_->unscale(optimizer);
  if (how.clip_val) {
    torch::nn::utils::clip_grad_value_(module.parameters(), *how.clip_val);
    return std::nullopt;
  }
  try {
    return torch::nn::utils::clip_grad_norm_(module.parameters(), *how.max_norm, how.norm_type, how.error_if_nonfinite);
  } catch (const c10::Error& e) {
    throw Error(
        fmt::format("clip_gradients: {} (set error_if_nonfinite = false to clip anyway)", e.what_without_backtrace()));
  }
}

torch::Tensor Fabric::all_reduce(torch::Tensor tensor, ReduceOp op) {
  require_launched("all_reduce");
  if (!group_) return tensor;
  group_->all_reduce(tensor, op);
  return tensor;
}

double Fabric::all_reduce(double value, ReduceOp op) {
  require_launched("all_reduce");
  return group_ ? group_->all_reduce(value, op) : value;
}

torch::Tensor Fabric::all_gather(const torch::Tensor& tensor) {
  require_launched("all_gather");
  if (!group_) return tensor;
  return torch::stack(group_->all_gather(tensor.to(device())));
}

torch::Tensor Fabric::broadcast(torch::Tensor tensor, int64_t src) {
  require_launched("broadcast");
  if (!group_) return tensor;
  torch::Tensor on_device = tensor.to(device()).contiguous();
  group_->broadcast(on_device, src);
  return on_device.to(tensor.device());
}

nlohmann::json Fabric::broadcast(const nlohmann::json& value, int64_t src) {
  require_launched("broadcast");
  if (!group_) return value;
  const std::string text = value.dump();
  torch::Tensor length = torch::tensor({static_cast<int64_t>(text.size())});
  length = broadcast(length, src);
  torch::Tensor bytes = torch::zeros({length.item<int64_t>()}, torch::kUInt8);
  if (global_rank() == src) std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  bytes = broadcast(bytes, src);
  const auto* data = bytes.data_ptr<uint8_t>();
  return nlohmann::json::parse(std::string(data, data + bytes.numel()));
}

void Fabric::barrier() {
  require_launched("barrier");
  if (group_) group_->barrier();
}

void Fabric::log(const std::string& name, double value, std::optional<int64_t> step) {
  log_dict({{name, value}}, step);
}

void Fabric::log(const std::string& name, const torch::Tensor& value, std::optional<int64_t> step) {
  if (value.numel() != 1)
    throw ConfigError(fmt::format("Fabric::log('{}'): a tensor of {} elements; log one value", name, value.numel()));
  log_dict({{name, value.item<double>()}}, step);
}

void Fabric::log_dict(const std::map<std::string, double>& metrics, std::optional<int64_t> step) {
  const int64_t at = step.value_or(log_calls_);
  ++log_calls_;
  for (auto& logger : loggers_) logger->log_metrics(metrics, at);
}

uint64_t Fabric::seed_everything(uint64_t seed) { return fulgor::seed_everything(seed); }

}  // namespace fulgor
