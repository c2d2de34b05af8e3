#pragma once

// The module, data and options the ddp Trainer workers train with, shared with
// the tests that recompute the expected results in one process.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "fulgor/fulgor.h"
#include "fulgor/distributed/sampler.h"
#include "scenarios.h"

namespace fulgor::test {

constexpr int64_t kStepsPerEpoch = 4;

inline torch::Tensor flat_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : module.parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat).clone();
}

/// The gradient-sync tests' network as a fulgor module. Every training step
/// logs the rank (plus one) reduced over the ranks each way, and unreduced.
struct RegressionNet : fulgor::Module {
  torch::nn::Sequential net{nullptr};
  explicit RegressionNet(uint64_t seed) { net = register_module("net", make_model(seed)); }

  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    torch::Tensor loss = torch::mse_loss(net->forward(batch.data), batch.target);
    const double value = static_cast<double>(trainer().global_rank() + 1);
    const std::pair<const char*, fulgor::Reduce> reductions[] = {{"rank_mean", fulgor::Reduce::mean},
                                                                 {"rank_sum", fulgor::Reduce::sum},
                                                                 {"rank_max", fulgor::Reduce::max},
                                                                 {"rank_min", fulgor::Reduce::min}};
    for (const auto& [name, reduce] : reductions) {
      fulgor::LogOptions options;
      options.on_step = false;
      options.on_epoch = true;
      options.reduce = reduce;
      options.sync_dist = true;
      log(name, value, options);
    }
    fulgor::LogOptions local;
    local.on_step = false;
    local.on_epoch = true;
    log("rank_local", value, local);
    log("train_loss", loss);
    return loss;
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(kLearningRate));
  }
};

/// kStepsPerEpoch global batches of kGlobalBatch samples, rank `rank` of
/// `world_size` reading its shard (in order) through a DistributedSampler.
inline fulgor::TensorLoader make_loader(int64_t world_size, int64_t rank) {
  auto [x, y] = make_data(kStepsPerEpoch);
  fulgor::DistributedSamplerOptions sampler_options;
  sampler_options.shuffle = false;
  fulgor::TensorLoaderOptions options;
  options.batch_size = kGlobalBatch / world_size;
  return fulgor::TensorLoader(
      x, y, std::make_unique<fulgor::DistributedSampler>(static_cast<size_t>(x.size(0)), world_size, rank, sampler_options),
      options);
}

inline fulgor::TrainerOptions ddp_options(const std::string& root, int64_t epochs, int64_t accumulate) {
  fulgor::TrainerOptions o;
  o.accelerator = "cpu";
  o.strategy = "ddp";
  o.max_epochs = epochs;
  o.accumulate_grad_batches = accumulate;
  o.enable_model_summary = false;
  o.enable_progress_bar = false;
  o.num_sanity_val_steps = 0;
  o.default_root_dir = root;
  return o;
}

}  // namespace fulgor::test
