#pragma once

#include <torch/script.h>
#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/module.h"

namespace fulgor {

/// How a TorchScriptModule trains.
struct TorchScriptOptions {
  /// The loss between forward's output and the batch's target: "mse",
  /// "l1", "smooth_l1", "huber", "cross_entropy", "nll" or "bce_with_logits"
  /// (torch.nn.functional's, at their defaults).
  std::string loss = "mse";
  /// Makes the optimizer(s) and schedulers from the module's parameters:
  /// what configure_optimizers returns. Required to train with the Trainer.
  std::function<OptimizerConfig(std::vector<torch::Tensor> parameters)> optimizer = nullptr;
};

/// A model defined in Python and saved with torch.jit.save (scripted or
/// traced), trained from C++ as a fulgor::Module: by the Trainer, by Fabric,
/// or by a loop of one's own.
///
///   fulgor::TorchScriptModule model("model.pt", {.loss = "cross_entropy",
///       .optimizer = [](auto params) { return std::make_shared<torch::optim::Adam>(params); }});
///   trainer.fit(model, loader);
///   fulgor::save_state_dict(model, "trained.pt");   // Python: net.load_state_dict(torch.load(...))
///
/// Note [TorchScript runs code]: loading a TorchScript file runs the
/// program it holds, by design: it is the user's own model, like a shared
/// library. fulgor's checkpoints hold the parameters and buffers only, never
/// the model's code, so a checkpoint still runs nothing of it when read.
///
/// Contract:
///   - The script module's parameters and buffers are this module's, under
///     the same dotted names (state_dict_of gives Python's state_dict()
///     names) and the very same tensors: moving, converting, loading a
///     checkpoint into them or an optimizer stepping them changes what the
///     script's forward computes.
///   - forward(inputs...) calls the script's forward. training_step is
///     forward(batch.data) and the configured loss against batch.target;
///     validation_step and test_step log that loss as "val_loss" and
///     "test_loss"; predict_step returns forward(batch.data).
///   - train(on) sets the script module's training mode too.
///   - Errors: a file that is not TorchScript, a forward that does not take
///     the given inputs or does not return a tensor, an unknown loss: a
///     ConfigError naming the file and what went wrong.
class FULGOR_API TorchScriptModule : public Module {
 public:
  explicit TorchScriptModule(const std::string& path, TorchScriptOptions options = {});
  /// A script module loaded already; `source` names it in errors.
  TorchScriptModule(torch::jit::Module script, std::string source, TorchScriptOptions options = {});

  /// The script's forward on `inputs`; throws ConfigError when it does not
  /// take them or does not return a tensor.
  torch::Tensor forward(std::vector<torch::jit::IValue> inputs);
  torch::Tensor forward(const torch::Tensor& input) { return forward(std::vector<torch::jit::IValue>{input}); }
  /// The configured loss of `output` against `target`.
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const;

  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override;
  void validation_step(torch::data::Example<> batch, int64_t batch_idx) override;
  void test_step(torch::data::Example<> batch, int64_t batch_idx) override;
  torch::Tensor predict_step(torch::data::Example<> batch, int64_t batch_idx) override;
  OptimizerConfig configure_optimizers() override;
  void train(bool on = true) override;

  torch::jit::Module& script() { return script_; }
  const std::string& source() const { return source_; }

  /// The loss names TorchScriptOptions::loss accepts.
  static const std::vector<std::string>& losses();

 private:
  torch::jit::Module script_;
  std::string source_;
  TorchScriptOptions options_;
};

}  // namespace fulgor
