#pragma once

// The model fulgor_checkpoint_writer trains, for the test to load its checkpoints into.

#include <torch/torch.h>

#include "fulgor/module.h"

namespace fulgor::testing {

// Large enough (about 1 MB of checkpoint with Adam's state) that a kill often
// lands in the middle of a save.
struct WriterModel : fulgor::Module {
  torch::nn::Linear layer{nullptr};

  WriterModel() { layer = register_module("layer", torch::nn::Linear(256, 256)); }

  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    auto loss = torch::mse_loss(layer(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
  }
};

}  // namespace fulgor::testing
