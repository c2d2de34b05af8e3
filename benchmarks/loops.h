#pragma once

// The sides of the overhead measurements: a hand-written LibTorch loop, the
// same training through fulgor::Trainer, and the loop run by fulgor::Fabric.
// All start from a copy of the same network and see the same batches in the
// same order.

#include <torch/torch.h>

#include <string>

#include "fulgor/optim/step_kernels.h"

namespace fulgor::bench {

constexpr int64_t kBatch = 32;

/// What the Trainer side turns on besides the training itself.
struct Variant {
  std::string name;
  bool progress_bar = false;
  int log_calls = 0;  // 1: log(loss) on the progress bar; 2: also log(batch index)
  bool checkpoint = false;
  std::string precision = "32";
  std::string profiler;  // TrainerOptions::profiler
  // "sgd": SGD(0.01) on both sides; "adam": torch::optim::Adam(1e-3) by hand
  // and fulgor::Adam(1e-3) with `kernels` in the Trainer.
  std::string optimizer = "sgd";
  StepKernels kernels;
  bool fabric = false;   // the hand-written loop run by fulgor::Fabric instead of the Trainer
  // The module's optimizer_zero_grad zeroes the gradients in place instead
  // of setting them to none (fulgor's default): the figure before the change.
  bool zeroed_in_place = false;
};

/// The fused step where `fused`, else the foreach step.
inline StepKernels fused_or_foreach(bool fused) {
  StepKernels kernels;
  if (fused)
    kernels.fused = true;
  else
    kernels.foreach = true;
  return kernels;
}

/// The data of a run: `epochs` passes over data/targets in order, batch kBatch.
struct Workload {
  torch::Tensor data, targets;
  int64_t epochs = 1;
  int64_t steps() const { return epochs * (data.size(0) / kBatch); }
};

/// The mean cross-entropy of `net` over the whole workload.
double final_loss(torch::nn::Sequential net, const Workload& work);

/// Trains a copy of `initial` by hand with SGD(0.01), or torch::optim::Adam(1e-3)
/// where `optimizer` is "adam"; returns the trained copy.
torch::nn::Sequential raw_fit(const torch::nn::Sequential& initial, const Workload& work,
                              const std::string& optimizer = "sgd");

/// Trains a copy of `initial` through the Trainer on the CPU with the
/// variant's optimizer, writing under `root_dir` (checkpoints); returns the trained copy.
torch::nn::Sequential fulgor_fit(const torch::nn::Sequential& initial, const Workload& work, const Variant& variant,
                                 const std::string& root_dir);

/// The hand-written loop of raw_fit, converted to fulgor::Fabric on one CPU
/// device: the Fabric side of the overhead measurements.
torch::nn::Sequential fabric_fit(const torch::nn::Sequential& initial, const Workload& work);

}  // namespace fulgor::bench
