#include "fulgor/fabric/fabric.h"

#include <c10/core/DefaultDtype.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>

#include "config/option_names.h"
#include "distributed/launcher.h"
#include "fabric/fabric_module.h"
#include "fulgor/config/seed.h"
#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fulgor/distributed/gradient_sync.h"
#include "fulgor/distributed/strategy.h"
#include "precision/precision_plugin.h"

namespace fulgor {
namespace {

detail::Sharding sharding_of(const FabricOptions& options) {
  return detail::sharding_of(options.strategy, options.sharding_strategy, options.zero_redundancy_optimizer);
}

// What shards the parameters, for messages.
std::string sharded_by(const FabricOptions& options) {
  return options.zero_redundancy_optimizer ? "zero_redundancy_optimizer" : "strategy 'fsdp'";
}

// The shards hold what the optimizer stepped until a gather copies them into
// the parameters; a step of the bare optimizer leaves the parameters behind,
// and the next reduction would overwrite the step.
void check_stepped_through_fabric(const detail::FabricModule& set_up, const FabricOptions& options) {
  if (!set_up.parallel.shards->stepped_ungathered()) return;
  throw Error(fmt::format(
      "the optimizer stepped the pieces of module '{}' without gathering them into its parameters: under {}, "
      "step through the FabricOptimizer (optimizer.step()) or fabric.step(optimizer), not optimizer->step()",
      set_up.module->name(), sharded_by(options)));
}

// torch::nn::utils::clip_grad_norm_'s rule, with the norm over the ranks'
// pieces of the gradients.
double clip_sharded_norm(detail::ParameterShards& shards, const std::vector<torch::Tensor>& pieces,
                         const ClipGradients& how, const FabricOptions& options) {
  if (how.norm_type != 2.0)
    throw ConfigError(fmt::format(
        "clip_gradients: norm_type={} under {}, whose norm over the ranks' pieces is the 2-norm: use norm_type = 2",
        how.norm_type, sharded_by(options)));
  const double norm = shards.gradient_norm(pieces);
  if (how.error_if_nonfinite && !std::isfinite(norm))
    throw Error(fmt::format(
        "clip_gradients: the total norm of the gradients is {}, so they cannot be clipped (set error_if_nonfinite "
        "= false to clip anyway)",
        norm));
  const double coefficient = *how.max_norm / (norm + 1e-6);
  torch::NoGradGuard no_grad;
  if (coefficient < 1)
    for (const auto& p : pieces)
      if (p.grad().defined()) p.mutable_grad().mul_(coefficient);
  return norm;
}

}  // namespace

BackwardSyncGuard::BackwardSyncGuard(detail::FabricModule* module, bool enabled) : module_(enabled ? module : nullptr) {
  if (!module_) return;
  previous_ = module_->sync();
  module_->set_sync(false);
}

BackwardSyncGuard::~BackwardSyncGuard() {
  if (module_) module_->set_sync(previous_);
}

Fabric::Fabric(FabricOptions options)
    : options_(std::move(options)), accelerator_(make_accelerator(options_.accelerator)) {
  detail::check_strategy(options_.strategy);
  detail::check_sharding(options_.strategy, options_.sharding_strategy, options_.zero_redundancy_optimizer);
  detail::check_state_dict_type(options_.state_dict_type);
  precision_ = std::make_unique<detail::PrecisionPlugin>();
  precision_->setup(options_.precision, *accelerator_);
  selected_ = accelerator_->parse_devices(options_.devices);
  environment_ = detect_distributed_environment();
  detail::check_job_size(options_.devices, selected_.size(), options_.num_nodes, environment_);
  // Refuses "single_device" with several devices, as the Trainer does.
  const bool launches =
      detail::launches_ranks(options_.strategy, environment_, *accelerator_, options_.devices, selected_.size());
  const bool data_parallel = launches || detail::runs_data_parallel(options_.strategy, environment_);
  strategy_ = !data_parallel ? "single_device" : options_.strategy == "fsdp" ? "fsdp" : "ddp";
  device_setup_ = detail::device_setup(*accelerator_, options_.devices, selected_, environment_);
  loggers_ = options_.loggers;
  callbacks_ = options_.callbacks;
  if (std::find(callbacks_.begin(), callbacks_.end(), nullptr) != callbacks_.end())
    throw ConfigError("FabricOptions::callbacks holds a null callback: give each as a std::make_shared<...>()");
}

Fabric::~Fabric() {
  modules_.clear();
  if (launched_) accelerator_->teardown();
}

const Precision& Fabric::precision() const { return precision_->precision(); }

GradScaler* Fabric::grad_scaler() const { return precision_->scaler(); }

void Fabric::launch() {
  if (launched_) throw Error("Fabric::launch() was called already: call it once");
  if (detail::launches_ranks(options_.strategy, environment_, *accelerator_, options_.devices, selected_.size()))
    environment_ = detail::launch_ranks(static_cast<int64_t>(selected_.size()));
  device_setup_ = detail::device_setup(*accelerator_, options_.devices, selected_, environment_);
  accelerator_->setup_device(device_setup_);
  if (strategy_ != "single_device") {
    // The Trainer's group (Note [One process group per process]), so that a
    // Fabric and Trainers of one program share it.
    group_ = std::make_unique<ProcessGroup>(
        detail::join_ddp(environment_, *accelerator_, device_setup_.device, options_.ddp_timeout)->group());
    detail::silence_off_rank_zero(loggers_, environment_);
  }
  launched_ = true;
}

// Lightning's _validate_launched: one process may skip launch().
void Fabric::require_launched(const char* what) const {
  if (launched_) return;
  if (strategy_ != "single_device")
    throw Error(
        fmt::format("Fabric::{} needs the job's processes: call fabric.launch() first ({} processes, "
                    "strategy '{}')",
                    what, std::max<size_t>(selected_.size(), static_cast<size_t>(environment_.world_size)), strategy_));
  const_cast<Fabric*>(this)->launch();
}

// The group a collective runs in; nullptr on one process.
ProcessGroup* Fabric::communicator(ProcessGroup* group) {
  if (group) return group;
  return group_.get();
}

DistributedShard Fabric::shard() const {
  DistributedShard shard;
  shard.num_replicas = world_size();
  shard.rank = global_rank();
  return shard;
}

void Fabric::setup_module(torch::nn::Module& module, bool move_to_device) {
  require_launched("setup");
  if (std::any_of(modules_.begin(), modules_.end(), [&](const auto& m) { return m->module == &module; }))
    throw ConfigError(fmt::format("the module '{}' was set up already: set up each module once", module.name()));
  precision().convert_module(module);
  if (move_to_device) accelerator_->move_module(module, device());
  auto set_up = std::make_unique<detail::FabricModule>();
  set_up->module = &module;
  if (group_)
    set_up->parallel = detail::attach_data_parallel(*group_, module, sharding_of(options_), environment_, precision());
  modules_.push_back(std::move(set_up));
}

FabricOptimizer Fabric::wrap_optimizer(torch::optim::Optimizer& optimizer) {
  require_launched("setup");
  if (std::find(optimizers_.begin(), optimizers_.end(), &optimizer) != optimizers_.end())
    throw ConfigError("an optimizer was set up already: set up each optimizer once");
  // An optimizer set up before its module, or over a module that is not set
  // up, would step whole parameters whose gradients backward never reduces.
  if (group_ && sharding_of(options_) != detail::Sharding::none) {
    size_t pieces = 0, trainable = 0;
    for (auto& m : modules_) {
      m->parallel.shards->shard(optimizer);
      pieces += m->parallel.shards->shards_in(optimizer).size();
    }
    for (const auto& group : optimizer.param_groups())
      trainable += static_cast<size_t>(
          std::count_if(group.params().begin(), group.params().end(), [](const auto& p) { return p.requires_grad(); }));
    if (pieces != trainable)
      throw ConfigError(fmt::format(
          "under {} an optimizer steps the ranks' pieces of the set-up modules' parameters, and this one holds {} "
          "trainable parameters of no set-up module: set the module up first (fabric.setup(module, optimizer), or "
          "setup_module before setup_optimizers)",
          sharded_by(options_), trainable - pieces));
    if (GradScaler* scaler = precision_->scaler()) scaler->set_found_inf_reduction(detail::summed_over(*group_));
  }
  optimizers_.push_back(&optimizer);
  return FabricOptimizer(*this, optimizer);
}

void Fabric::to_device(torch::nn::Module& module) const { accelerator_->move_module(module, device()); }

detail::FabricModule* Fabric::set_up(const torch::nn::Module& module, const char* what) const {
  const auto it = std::find_if(modules_.begin(), modules_.end(), [&](const auto& m) { return m->module == &module; });
  if (it == modules_.end())
    throw ConfigError(
        fmt::format("the module '{}' was not set up: call fabric.setup(module, ...) before {}", module.name(), what));
  return it->get();
}

BackwardSyncGuard Fabric::no_backward_sync(torch::nn::Module& module, bool enabled) {
  return BackwardSyncGuard(set_up(module, "no_backward_sync"), enabled);
}

void Fabric::with_whole_parameters(torch::nn::Module& module, const std::function<void()>& body) {
  detail::FabricModule* set_up = this->set_up(module, "with_whole_parameters");
  if (set_up->parallel.shards)
    set_up->parallel.shards->with_whole_parameters(body, detail::ParameterShards::Whole::on_every_rank);
  else
    body();
}

// Note [Buffers under Fabric's ddp]
// PyTorch's DDP copies rank 0's buffers (batch-norm statistics) to every rank
// before each synchronized forward pass, which it sees because the module is
// its wrapper. Fabric does not wrap the forward pass, so it copies them after
// a synchronized backward pass instead: the next forward pass starts from the
// same buffers as under DDP; only the buffers after the last step differ
// (rank 0's on every rank, where DDP leaves each rank's own).
void Fabric::backward(const torch::Tensor& loss) {
  if (precision().mixed && !std::exchange(autocast_since_backward_, false))
    warn_once(
        fmt::format("precision '{}': no fabric.autocast() scope was open since the last backward, so the forward "
                    "pass ran in float32; compute the loss inside `auto autocast = fabric.autocast();`",
                    precision().name));
  precision_->scale(loss).backward();
  for (auto& m : modules_) {
    if (auto& synchronizer = m->parallel.synchronizer) {
      synchronizer->finish_backward();
      synchronizer->before_forward();
    }
    if (m->parallel.shards && m->sync()) {
      check_stepped_through_fabric(*m, options_);
      m->parallel.shards->reduce_gradients();
    } else if (m->parallel.shards) {
      m->parallel.shards->end_unsynchronized_pass();
    }
  }
}

bool Fabric::step(torch::optim::Optimizer& optimizer) {
  check_reduced(optimizer);
  const bool stepped = precision_->step(optimizer);
  precision_->update();
  // Under sharding it stepped this rank's pieces, which every rank needs in
  // the parameters it computes with.
  for (auto& m : modules_)
    if (m->parallel.shards && !m->parallel.shards->shards_in(optimizer).empty())
      m->parallel.shards->gather_parameters();
  return stepped;
}

// The gradients `optimizer` would step on were averaged over the ranks.
void Fabric::check_reduced(torch::optim::Optimizer& optimizer) const {
  for (const auto& m : modules_) {
    if (m->parallel.synchronizer && m->parallel.synchronizer->pending())
      throw Error(
          "the optimizer would step on gradients that were not averaged over the ranks: under ddp, call "
          "fabric.backward(loss) instead of loss.backward()");
    const auto& shards = m->parallel.shards;
    if (!shards || shards->shards_in(optimizer).empty()) continue;
    check_stepped_through_fabric(*m, options_);
    if (shards->gradients_pending())
      throw Error(fmt::format(
          "the optimizer would step on gradients of module '{}' that were not reduced over the ranks: under {}, "
          "call fabric.backward(loss) instead of loss.backward(), and step after a backward outside "
          "no_backward_sync",
          m->module->name(), sharded_by(options_)));
  }
}

std::optional<double> Fabric::clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                             const ClipGradients& how) {
  if (how.clip_val.has_value() == how.max_norm.has_value())
    throw ConfigError(how.clip_val ? "clip_gradients: both clip_val and max_norm are set; set one of them"
                                   : "clip_gradients: set clip_val or max_norm to clip gradients");
  precision_->unscale(optimizer);
  // Under sharding the gradients are on the optimizer's pieces of the
  // parameters; backward freed the module's.
  const auto it = std::find_if(modules_.begin(), modules_.end(), [&](const auto& m) { return m->module == &module; });
  detail::ParameterShards* shards = it != modules_.end() ? (*it)->parallel.shards.get() : nullptr;
  const std::vector<torch::Tensor> params = shards ? shards->shards_in(optimizer) : module.parameters();
  if (how.clip_val) {
    torch::nn::utils::clip_grad_value_(params, *how.clip_val);
    return std::nullopt;
  }
  if (shards) return clip_sharded_norm(*shards, params, how, options_);
  try {
    return torch::nn::utils::clip_grad_norm_(params, *how.max_norm, how.norm_type, how.error_if_nonfinite);
  } catch (const c10::Error& e) {
    throw Error(
        fmt::format("clip_gradients: {} (set error_if_nonfinite = false to clip anyway)", e.what_without_backtrace()));
  }
}

torch::Tensor Fabric::all_reduce(torch::Tensor tensor, ReduceOp op, ProcessGroup* group) {
  require_launched("all_reduce");
  if (ProcessGroup* in = communicator(group)) in->all_reduce(tensor, op);
  return tensor;
}

double Fabric::all_reduce(double value, ReduceOp op, ProcessGroup* group) {
  require_launched("all_reduce");
  ProcessGroup* in = communicator(group);
  return in ? in->all_reduce(value, op) : value;
}

torch::Tensor Fabric::all_gather(const torch::Tensor& tensor, ProcessGroup* group) {
  require_launched("all_gather");
  ProcessGroup* in = communicator(group);
  return in ? torch::stack(in->all_gather(tensor.to(device()))) : tensor;
}

torch::Tensor Fabric::broadcast(torch::Tensor tensor, int64_t src, ProcessGroup* group) {
  require_launched("broadcast");
  ProcessGroup* in = communicator(group);
  if (!in) return tensor;
  torch::Tensor on_device = tensor.to(device()).contiguous();
  in->broadcast(on_device, src);
  return on_device.to(tensor.device());
}

nlohmann::json Fabric::broadcast(const nlohmann::json& value, int64_t src) {
  require_launched("broadcast");
  if (!group_) return value;
  return nlohmann::json::parse(group_->broadcast_text(value.dump(), src));
}

void Fabric::barrier(ProcessGroup* group) {
  require_launched("barrier");
  if (ProcessGroup* in = communicator(group)) in->barrier();
}

std::optional<ProcessGroup> Fabric::new_group(const std::vector<int64_t>& ranks) {
  require_launched("new_group");
  if (group_) return group_->new_group(ranks);
  if (ranks != std::vector<int64_t>{0})
    throw ConfigError(fmt::format("new_group([{}]) on one process: the only rank is 0", fmt::join(ranks, ", ")));
  return std::nullopt;
}

DefaultDtypeGuard::DefaultDtypeGuard(const Precision& precision) {
  if (!precision.converts_module()) return;
  previous_ = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::fromScalarType(precision.dtype));
}

DefaultDtypeGuard::~DefaultDtypeGuard() {
  if (previous_) c10::set_default_dtype(*previous_);
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

// Lightning's rank_zero_warn, once per message.
void Fabric::warn_once(const std::string& message) {
  if (is_global_zero() && warned_.insert(message).second) std::cerr << "fulgor: " << message << std::endl;
}

}  // namespace fulgor
