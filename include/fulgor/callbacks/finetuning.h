#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Freezes parts of the module before training and unfreezes them later into
/// new parameter groups of the optimizer (Lightning 2.6's BaseFinetuning).
/// Derive and override freeze_before_training (called at every setup) and
/// finetune_function (called at every training epoch's start, for each
/// optimizer), using the helpers below.
///
/// Contract: the parameter groups added since configure_optimizers are in
/// checkpoints (their parameters by name, and their rates); a resumed fit adds
/// them again at on_fit_start, their parameters trainable, before the
/// optimizers' states are loaded, so that those fit. Differences from
/// Lightning: a parameter already in an optimizer is recognised by identity
/// (Lightning compares values), and the parameters of a group added again on
/// resume are made trainable (Lightning leaves them frozen after
/// freeze_before_training).
class FULGOR_API BaseFinetuning : public Callback {
 public:
  virtual void freeze_before_training(ModuleBase& module) = 0;
  virtual void finetune_function(ModuleBase& module, int64_t epoch, torch::optim::Optimizer& optimizer) = 0;

  /// The leaf modules of `module`, and those with parameters of their own.
  static std::vector<torch::nn::Module*> flatten_modules(torch::nn::Module& module);
  /// The parameters of `module` whose requires_grad is `requires_grad`,
  /// BatchNorm layers' left out unless `train_bn`.
  static std::vector<torch::Tensor> filter_params(torch::nn::Module& module, bool train_bn = true,
                                                  bool requires_grad = true);
  /// Makes every parameter trainable and the BatchNorm layers track their statistics.
  static void make_trainable(torch::nn::Module& module);
  /// Stops the parameters of `module` alone (not its children's) from training,
  /// and a BatchNorm layer from tracking its statistics.
  static void freeze_module(torch::nn::Module& module);
  /// Freezes every layer of `module`; with train_bn the BatchNorm layers stay trainable.
  static void freeze(torch::nn::Module& module, bool train_bn = true);
  /// `params` less those already in one of the optimizer's groups.
  static std::vector<torch::Tensor> filter_on_optimizer(const torch::optim::Optimizer& optimizer,
                                                        const std::vector<torch::Tensor>& params);
  /// Makes `module` trainable and adds its parameters not yet in `optimizer`
  /// as a new group, whose rate is `lr`, or the first group's divided by
  /// initial_denom_lr. Adds nothing when no parameter is left.
  static void unfreeze_and_add_param_group(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                           std::optional<double> lr = std::nullopt, double initial_denom_lr = 10.0,
                                           bool train_bn = true);

  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_fit_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_epoch_start(Trainer& trainer, ModuleBase& module) override;

 private:
  void store(const ModuleBase& module, size_t optimizer_idx, size_t groups_before,
             const torch::optim::Optimizer& optimizer);

  /// Per optimizer, its groups: {"params": [names], "lr": rate}.
  std::map<size_t, nlohmann::json> groups_;
  bool restarting_ = false;
};

/// Options of BackboneFinetuning, with Lightning's defaults.
struct BackboneFinetuningOptions {
  int64_t unfreeze_backbone_at_epoch = 10;
  /// The backbone's rate is multiplied by lambda_func(epoch + 1) at each later epoch.
  std::function<double(int64_t)> lambda_func = [](int64_t) { return 2.0; };
  double backbone_initial_ratio_lr = 0.1;     ///< the backbone's first rate, times the first group's
  std::optional<double> backbone_initial_lr;  ///< or this rate
  bool should_align = true;                   ///< the backbone's rate stops at the first group's
  double initial_denom_lr = 10.0;
  bool train_bn = true;
};

/// Trains the module's child named "backbone" from epoch
/// unfreeze_backbone_at_epoch on, in a new parameter group whose rate then
/// grows by lambda_func (Lightning 2.6's BackboneFinetuning). A module without
/// a "backbone" child is a ConfigError.
class FULGOR_API BackboneFinetuning : public BaseFinetuning {
 public:
  explicit BackboneFinetuning(BackboneFinetuningOptions options = {});

  void freeze_before_training(ModuleBase& module) override;
  void finetune_function(ModuleBase& module, int64_t epoch, torch::optim::Optimizer& optimizer) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

  /// The backbone's rate at the last epoch start, once unfrozen.
  std::optional<double> previous_backbone_lr() const { return previous_backbone_lr_; }

 private:
  BackboneFinetuningOptions options_;
  std::optional<double> previous_backbone_lr_;
};

}  // namespace fulgor
