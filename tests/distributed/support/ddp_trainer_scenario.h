#pragma once

// The module, data and options the ddp Trainer workers train with, shared with
// the tests that recompute the expected results in one process.

#include <torch/torch.h>

#include <csignal>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fulgor/data/distributed_sampler.h"
#include "fulgor/fulgor.h"
#include "scenarios.h"

namespace fulgor::test {

constexpr int64_t kStepsPerEpoch = 4;

/// The tensor `name` of the archive at `path`, as the workers write them.
inline torch::Tensor read_tensor(const std::string& path, const char* name) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::Tensor t;
  archive.read(name, t);
  return t;
}

inline torch::Tensor flat_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : module.parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat).clone();
}

/// The gradient-sync tests' network as a fulgor module. Every training step
/// logs the rank (plus one) reduced over the ranks each way, and unreduced;
/// after every backward pass it records the gradients it holds. With
/// set_automatic_optimization(false) it takes its SGD steps itself.
struct RegressionNet : fulgor::Module {
  torch::nn::Sequential net{nullptr};
  /// One row per backward pass: every parameter's gradient, flattened.
  std::vector<torch::Tensor> gradients;
  /// Rank 1 sends itself this signal in the training step of batch 2 (0:
  /// never), of every epoch or of epoch die_in_epoch alone.
  int die_signal = 0;
  int64_t die_in_epoch = -1;
  /// Logs "disagreeing" without sync_dist: the epoch on rank 0, minus the
  /// epoch on the others, so the ranks disagree on whether it improved.
  bool log_disagreeing = false;
  /// Rank r adds r + 1 with weight 2r + 1 at every step: over both ranks its
  /// epoch value is 7/4 (weights summed), where a mean of the ranks' values
  /// would be 3/2.
  fulgor::metrics::MeanMetric rank_metric;

  explicit RegressionNet(uint64_t seed) : RegressionNet(make_model(seed)) {}
  explicit RegressionNet(torch::nn::Sequential model) { net = register_module("net", std::move(model)); }

  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    if (die_signal != 0 && trainer().global_rank() == 1 && batch_idx == 2 &&
        (die_in_epoch < 0 || trainer().current_epoch() == die_in_epoch))
      std::raise(die_signal);
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
    rank_metric.update(torch::full({1}, value), 2 * value - 1);
    log("rank_metric", rank_metric, local);
    if (log_disagreeing) {
      const double epoch = static_cast<double>(trainer().current_epoch());
      log("disagreeing", trainer().global_rank() == 0 ? epoch : -epoch, local);
    }
    log("train_loss", loss);
    if (automatic_optimization()) return loss;
    // Manual optimization: the same SGD step, taken by the module.
    auto& opt = optimizers()[0];
    opt.zero_grad();
    manual_backward(loss);
    opt.step();
    return loss.detach();
  }
  void on_after_backward() override {
    std::vector<torch::Tensor> flat;
    for (const auto& p : parameters())
      flat.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}));
    gradients.push_back(torch::cat(flat).clone());
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(kLearningRate));
  }
};

/// make_model with a BatchNorm1d after its first layer (sync_batchnorm).
inline torch::nn::Sequential make_batchnorm_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(kFeatures, 8), torch::nn::BatchNorm1d(8), torch::nn::Tanh(),
                               torch::nn::Linear(8, 1));
}

/// kStepsPerEpoch global batches of kGlobalBatch samples, reshuffled every
/// epoch; rank `rank` of `world_size` reads its shard through a
/// DistributedSampler. The ranks' batch k together hold the samples of the
/// single process's batch k (positions 32k..32k+31 of the epoch's order).
inline fulgor::TensorLoader make_loader(int64_t world_size, int64_t rank) {
  auto [x, y] = make_data(kStepsPerEpoch);
  fulgor::DistributedSamplerOptions sampler_options;
  sampler_options.seed = 11;
  fulgor::TensorLoaderOptions options;
  options.batch_size = kGlobalBatch / world_size;
  return fulgor::TensorLoader(
      x, y,
      std::make_unique<fulgor::DistributedSampler>(static_cast<size_t>(x.size(0)), world_size, rank, sampler_options),
      options);
}

/// Saves a checkpoint at the batch that takes the run to `step`, inside the
/// epoch: one saved after fit would resume at the next epoch, since the epoch a
/// stop cuts short counts as done (Lightning's rule). `in_background`: through
/// save_checkpoint_async, as ModelCheckpoint saves (with async_checkpointing).
class SaveAtStep final : public fulgor::Callback {
 public:
  SaveAtStep(int64_t step, std::string path, bool in_background = false)
      : step_(step), path_(std::move(path)), in_background_(in_background) {}
  void on_train_batch_end(fulgor::Trainer& trainer, fulgor::ModuleBase&, const torch::Tensor&, int64_t) override {
    if (trainer.global_step() != step_) return;
    if (in_background_)
      trainer.save_checkpoint_async(path_);
    else
      trainer.save_checkpoint(path_);
  }

 private:
  int64_t step_;
  std::string path_;
  bool in_background_;
};

/// Rank-0-only output is part of what the tests check, so the progress bar
/// and the model summary are on.
inline fulgor::TrainerOptions ddp_options(const std::string& root, int64_t epochs, int64_t accumulate) {
  fulgor::TrainerOptions o;
  o.accelerator = "cpu";
  o.strategy = "ddp";
  o.max_epochs = epochs;
  o.accumulate_grad_batches = accumulate;
  o.num_sanity_val_steps = 0;
  o.default_root_dir = root;
  return o;
}

/// `o` without logger, checkpoints, progress bar and model summary.
inline fulgor::TrainerOptions quiet(fulgor::TrainerOptions o) {
  o.logger = false;
  o.enable_checkpointing = false;
  o.enable_progress_bar = false;
  o.enable_model_summary = false;
  return o;
}

}  // namespace fulgor::test
