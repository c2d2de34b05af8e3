#pragma once

// The module and options the sharded-strategy workers train with, shared with
// the tests that resume their checkpoints in one process.

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "../../support/fp16_cpu.h"
#include "ddp_trainer_scenario.h"
#include "fulgor/distributed/sharded_unit.h"
#include "fulgor/optim/adam.h"

namespace fulgor::test {

constexpr int64_t kShardedEpochs = 3;
constexpr uint64_t kShardedSeed = 5;
// With 4 batches an epoch and 2 accumulated (adam), the middle of the second
// epoch; with sgd, which steps every batch, the end of its first batch.
constexpr int64_t kShardedMidStep = 3;

/// torch::nn::Linear counting its forward passes, and recording the dtype
/// of its weight in the last.
struct CountedLinearImpl : torch::nn::LinearImpl {
  CountedLinearImpl(int64_t in, int64_t out, std::shared_ptr<int64_t> forwards,
                    std::shared_ptr<torch::ScalarType> computed_in)
      : torch::nn::LinearImpl(in, out), forwards(std::move(forwards)), computed_in(std::move(computed_in)) {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++*forwards;
    *computed_in = weight.scalar_type();
    return torch::nn::LinearImpl::forward(x);
  }
  std::shared_ptr<int64_t> forwards;
  std::shared_ptr<torch::ScalarType> computed_in;
};

/// Linear(4, 5), Tanh, Linear(5, 1) in float64: 20 + 5 + 5 + 1 elements, so
/// that 2 and 4 ranks pad three of the parameters, and the last is a single
/// element (three of four ranks hold only padding of it). Each Linear is a
/// fulgor::Sharded unit, which FULL_SHARD alone shards: the first, whose
/// input needs no gradient, is reduced after backward; the second when its
/// own backward ends. `checkpoint_activations`: the units' too, so that
/// backward gathers them to run their forward again;
/// `reshard_after_forward`: the units' too; `dtype`: the parameters' and
/// the data's.
struct ShardedNet : fulgor::Module {
  torch::nn::Sequential net{nullptr};
  std::string optimizer;
  bool checkpoint_activations;
  torch::ScalarType dtype;
  std::shared_ptr<int64_t> forwards = std::make_shared<int64_t>(0);  // the units'
  std::shared_ptr<torch::ScalarType> computed_in = std::make_shared<torch::ScalarType>(torch::kFloat64);

  ShardedNet(uint64_t seed, std::string optimizer_name, bool checkpoint_activations = false,
             bool reshard_after_forward = true, torch::ScalarType dtype = torch::kFloat64)
      : optimizer(std::move(optimizer_name)), checkpoint_activations(checkpoint_activations), dtype(dtype) {
    torch::manual_seed(seed);
    fulgor::ShardedOptions unit;
    unit.checkpoint_activations = checkpoint_activations;
    unit.reshard_after_forward = reshard_after_forward;
    net = register_module(
        "net", torch::nn::Sequential(
                   fulgor::Sharded(std::make_shared<CountedLinearImpl>(kFeatures, 5, forwards, computed_in), unit),
                   torch::nn::Tanh(),
                   fulgor::Sharded(std::make_shared<CountedLinearImpl>(5, 1, forwards, computed_in), unit)));
    to(dtype);
  }
  /// The bytes in memory on this rank of the units' parameters, and those
  /// they hold whole.
  int64_t parameter_bytes() const {
    int64_t bytes = 0;
    for (const auto& p : net->parameters()) bytes += static_cast<int64_t>(p.storage().nbytes());
    return bytes;
  }
  int64_t whole_parameter_bytes() const {
    int64_t bytes = 0;
    for (const auto& p : net->parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
    return bytes;
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::mse_loss(net->forward(batch.data.to(dtype)), batch.target.to(dtype));
  }
  // Under inference mode, where FULL_SHARD's units gather and release too.
  void validation_step(torch::data::Example<> batch, int64_t) override {
    log("val_loss", torch::mse_loss(net->forward(batch.data.to(dtype)), batch.target.to(dtype)));
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    if (optimizer == "adam")
      return std::make_shared<fulgor::Adam>(parameters(), torch::optim::AdamOptions(0.05).weight_decay(0.01));
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
};

/// ShardedNet whose loss adds spike * 1e308, spike a parameter of one
/// element that stays 0, at the second batch of rank 1 (and 0 elsewhere):
/// under precision "16-mixed" the loss scale makes that batch's gradient of
/// spike alone infinite, which on 2 ranks only rank 0 holds a piece of
/// where the gradients are sharded.
struct SpikedNet : ShardedNet {
  torch::Tensor spike;
  int64_t rank, batches = 0;
  explicit SpikedNet(int64_t rank) : ShardedNet(kShardedSeed, "sgd"), rank(rank) {
    spike = register_parameter("spike", torch::zeros({1}, torch::kFloat64));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t index) override {
    const double factor = rank == 1 && batches++ == 1 ? kSpike : 0.0;
    return ShardedNet::training_step(batch, index) + (spike * factor).sum();
  }
};

/// More elements than one message of 25 MB carries over 2 or 4 ranks in
/// float64, and a multiple of neither: a parameter of them is reduced and
/// gathered in two messages, and padded (Note [Parameter shards]).
constexpr int64_t kWideElements = 3'500'001;

/// One parameter of kWideElements; the batch shifted by the products of its
/// first and last elements, which lie in the first and the last message.
struct WideImpl : torch::nn::Module {
  torch::Tensor w;
  WideImpl() { w = register_parameter("w", torch::randn({kWideElements}, torch::kFloat64)); }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t f = x.size(1);
    return x + w.narrow(0, 0, f) * w.narrow(0, kWideElements - f, f);
  }
};

/// ShardedNet behind a fulgor::Sharded WideImpl.
struct WideNet : ShardedNet {
  fulgor::Sharded<std::shared_ptr<WideImpl>> wide{nullptr};
  WideNet() : ShardedNet(kShardedSeed, "sgd") {
    wide = register_module("wide", fulgor::Sharded(std::make_shared<WideImpl>()));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::mse_loss(net->forward(wide(batch.data.to(dtype))), batch.target.to(dtype));
  }
};

/// A worker's VARIANT argument (sharded_worker.cpp).
struct ShardedVariant {
  std::string name, strategy, optimizer, from;
  bool resumed = false;
  bool checkpoint_activations = false;  // "_ckpt" in the name
  bool sharded_checkpoints = false;     // "_dcp" in the name: state_dict_type "sharded"
  bool reshard_after_forward = true;    // false with "_keep" in the name
  bool spiked = false;                  // "_spike" in the name: SpikedNet under precision "16-mixed"
  bool bf16 = false;                    // "_bf16" in the name: float32, precision "bf16-mixed"
  bool wide = false;                    // "_wide" in the name: WideNet
  bool uneven = false;                  // "_uneven" in the name: the last rank's module has a parameter more
  /// Whether the units' parameters are released between steps.
  bool shards_units() const { return strategy == "full_shard" || strategy == "hybrid_shard"; }
};

inline ShardedVariant parse_variant(const std::string& text) {
  ShardedVariant v;
  const auto equals = text.find('=');
  v.name = text.substr(0, equals);
  if (equals != std::string::npos) v.from = text.substr(equals + 1);
  v.resumed = v.name.size() > 8 && v.name.compare(v.name.size() - 8, 8, "_resumed") == 0;
  for (const char* strategy : {"ddp", "zero1", "shard_grad_op", "no_shard", "full_shard", "hybrid_shard"})
    if (v.name.rfind(std::string(strategy) + "_", 0) == 0) v.strategy = strategy;
  v.optimizer = v.name.find("_adam") != std::string::npos ? "adam" : "sgd";
  v.checkpoint_activations = v.name.find("_ckpt") != std::string::npos;
  v.sharded_checkpoints = v.name.find("_dcp") != std::string::npos;
  v.reshard_after_forward = v.name.find("_keep") == std::string::npos;
  v.spiked = v.name.find("_spike") != std::string::npos;
  v.bf16 = v.name.find("_bf16") != std::string::npos;
  v.wide = v.name.find("_wide") != std::string::npos;
  v.uneven = v.name.find("_uneven") != std::string::npos;
  if (v.strategy.empty()) throw std::invalid_argument("unknown variant " + text);
  return v;
}

/// The Trainer's options for `variant`: quiet, float64, 3 epochs.
inline fulgor::TrainerOptions sharded_options(const ShardedVariant& variant, const std::string& root) {
  fulgor::TrainerOptions o = quiet(ddp_options(root, kShardedEpochs, variant.optimizer == "adam" ? 2 : 1));
  o.strategy = variant.strategy == "ddp" || variant.strategy == "zero1" ? "ddp" : "fsdp";
  if (o.strategy == "fsdp") {  // shard_grad_op: SHARD_GRAD_OP
    o.sharding_strategy = variant.strategy;
    std::transform(variant.strategy.begin(), variant.strategy.end(), o.sharding_strategy.begin(),
                   [](unsigned char c) { return std::toupper(c); });
  }
  o.zero_redundancy_optimizer = variant.strategy == "zero1";
  o.gradient_clip_algorithm = variant.optimizer == "adam" ? "norm" : "value";
  o.gradient_clip_val = variant.optimizer == "adam" ? 0.3 : 0.05;
  o.state_dict_type = variant.sharded_checkpoints ? "sharded" : "full";
  if (variant.bf16) o.precision = "bf16-mixed";
  if (variant.spiked) {  // registered by the worker
    o.accelerator = "fp16_scaling_cpu";
    o.precision = "16-mixed";
  }
  return o;
}

}  // namespace fulgor::test
