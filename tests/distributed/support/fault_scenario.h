#pragma once

// The job the fault-injection test kills at random (fault_worker.cpp and
// fault_injection_test.cpp): its module, data, options and what each rank
// writes at the end.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp_trainer_scenario.h"
#include "fulgor/data/distributed_sampler.h"
#include "fulgor/detail/compat.h"
#include "fulgor/fulgor.h"

namespace fulgor::test {

constexpr int64_t kFaultStepsPerEpoch = 8;

/// make_model in float64, optimized by Adam; every step logs its loss
/// averaged over the ranks, one more collective besides the gradients'.
struct FaultNet : fulgor::Module {
  torch::nn::Sequential net{nullptr};

  explicit FaultNet(uint64_t seed) {
    net = register_module("net", make_model(seed));
    net->to(torch::kFloat64);
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    torch::Tensor loss = torch::mse_loss(net->forward(batch.data), batch.target);
    fulgor::LogOptions synced;
    synced.sync_dist = true;
    log("train_loss", loss, synced);
    return loss;
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01));
  }
};

/// kFaultStepsPerEpoch global batches of kGlobalBatch float64 samples,
/// reshuffled every epoch, rank `rank`'s shard through a DistributedSampler.
inline fulgor::TensorLoader make_fault_loader(int64_t world_size, int64_t rank) {
  auto [x, y] = make_data(kFaultStepsPerEpoch);
  fulgor::DistributedSamplerOptions sampler_options;
  sampler_options.seed = 17;
  fulgor::TensorLoaderOptions options;
  options.batch_size = kGlobalBatch / world_size;
  return fulgor::TensorLoader(
      x.to(torch::kFloat64), y.to(torch::kFloat64),
      std::make_unique<fulgor::DistributedSampler>(static_cast<size_t>(x.size(0)), world_size, rank, sampler_options),
      options);
}

/// Where the job saves: after every step, the step's checkpoint and last.ckpt.
inline std::string fault_checkpoint_dir(const std::string& out) { return out + "/checkpoints"; }

inline fulgor::TrainerOptions fault_options(const std::string& out, int64_t epochs) {
  fulgor::TrainerOptions o;
  o.accelerator = "cpu";
  o.strategy = "ddp";
  o.max_epochs = epochs;
  o.num_sanity_val_steps = 0;
  o.default_root_dir = out;
  o.logger = false;
  o.enable_progress_bar = false;
  o.enable_model_summary = false;
  // A peer that died is seen at once (its connection closes); this bounds
  // anything else.
  o.ddp_timeout = 30.0;
  fulgor::ModelCheckpointOptions every_step;
  every_step.dirpath = fault_checkpoint_dir(out);
  every_step.every_n_train_steps = 1;
  every_step.save_last = true;
  o.callbacks = {std::make_shared<fulgor::ModelCheckpoint>(every_step)};
  return o;
}

/// What rank `rank` writes at the end (fault_worker.cpp).
inline std::string fault_result_path(const std::string& out, int64_t rank) {
  return out + "/result_rank" + std::to_string(rank) + ".pt";
}

/// The tensors of a result file, compared bit for bit.
inline const std::vector<std::string>& fault_result_names() {
  static const std::vector<std::string> names = {"parameters", "exp_avg", "exp_avg_sq", "adam_steps", "counters"};
  return names;
}

/// The parameters, Adam's moments and step counts (parameter by parameter,
/// flattened) and the loop counters: global_step, current_epoch, and fit's
/// global_step and epochs_completed.
inline void write_fault_result(const std::string& path, fulgor::Trainer& trainer, const fulgor::FitResult& fit,
                               FaultNet& model) {
  const torch::optim::Optimizer& optimizer = *trainer.optimizers().at(0);
  std::vector<torch::Tensor> exp_avg, exp_avg_sq;
  std::vector<int64_t> steps;
  for (const auto& p : model.parameters()) {
    const auto& state =
        dynamic_cast<const torch::optim::AdamParamState&>(*detail::compat::optimizer_param_state(optimizer, p));
    exp_avg.push_back(state.exp_avg().reshape({-1}));
    exp_avg_sq.push_back(state.exp_avg_sq().reshape({-1}));
    steps.push_back(state.step());
  }
  torch::serialize::OutputArchive archive;
  archive.write("parameters", flat_parameters(model));
  archive.write("exp_avg", torch::cat(exp_avg));
  archive.write("exp_avg_sq", torch::cat(exp_avg_sq));
  archive.write("adam_steps", torch::tensor(steps, torch::kLong));
  archive.write("counters", torch::tensor(std::vector<int64_t>{trainer.global_step(), trainer.current_epoch(),
                                                               fit.global_step, fit.epochs_completed},
                                          torch::kLong));
  archive.save_to(path);
}

}  // namespace fulgor::test
