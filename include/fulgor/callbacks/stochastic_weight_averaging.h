#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"
#include "fulgor/optim/scheduler.h"

namespace fulgor {

/// torch.optim.swa_utils.SWALR: anneals each group's rate from where it is
/// to its SWA rate over `anneal_epochs` steps, by cosine ("cos") or linearly
/// ("linear"), then holds it. `swa_lrs` has one rate for all groups or one
/// per group. Refuses, with a ConfigError, another strategy, a negative
/// anneal_epochs, or a list of another length than the groups.
class FULGOR_API SWALR : public LRScheduler {
 public:
  SWALR(torch::optim::Optimizer& optimizer, std::vector<double> swa_lrs, int64_t anneal_epochs = 10,
        const std::string& anneal_strategy = "cos");

 protected:
  std::vector<double> get_lr() override;

 private:
  double anneal(double t) const;

  std::vector<double> swa_lrs_;
  int64_t anneal_epochs_;
  bool cosine_;
};

/// torch.optim.swa_utils.update_bn: recomputes the running statistics of
/// every BatchNorm1d/2d/3d in `model` from what `forward_pass` runs through
/// it: the statistics are reset, each layer's momentum is unset (a cumulative
/// average over the batches) while the pass runs in training mode, then the
/// momenta and the model's mode are put back. Returns whether the model has
/// batch-norm layers (none: nothing is run).
FULGOR_API bool update_bn(torch::nn::Module& model, const std::function<void()>& forward_pass);

/// Options of StochasticWeightAveraging, with Lightning's defaults.
struct StochasticWeightAveragingOptions {
  /// The SWA learning rate: one for all parameter groups, or one per group (required, positive).
  std::vector<double> swa_lrs;
  /// An integer: the 1-based epoch averaging starts at (at least 1); a
  /// fraction in [0, 1]: that share of max_epochs.
  std::variant<int64_t, double> swa_epoch_start = 0.8;
  int64_t annealing_epochs = 10;
  std::string annealing_strategy = "cos";  ///< "cos" or "linear"
  /// Where the averaged parameters live; nullopt: on the module's device.
  std::optional<torch::Device> device = torch::Device(torch::kCPU);
  /// Runs the module's forward over the training data, for the batch-norm
  /// pass at the end (required when the module has batch-norm layers).
  std::function<void(ModuleBase&)> bn_forward;
};

/// Stochastic Weight Averaging (Lightning's StochasticWeightAveraging).
///
/// Contract, as Lightning's: with swa_start = swa_epoch_start - 1 (0-based)
/// and swa_end = max_epochs - 1, each epoch from swa_start to swa_end begins
/// by taking the module's parameters into their equally weighted average, and
/// from swa_start on the optimizer's rates follow SWALR(swa_lrs,
/// annealing_epochs, annealing_strategy), stepped as each epoch ends. When
/// training ends after swa_end the module takes the averaged parameters;
/// then, for a module with batch-norm layers, update_bn recomputes their
/// statistics over bn_forward's pass (Lightning runs one more epoch of
/// training_step without backward for it). A checkpoint holds the averaged
/// parameters (this callback's tensors), the number of models averaged, the
/// last epoch averaged and SWALR's state, from which a resume continues
/// exactly. Refuses (ConfigError) bad options as Lightning does, more than one
/// optimizer, a fractional start with max_epochs -1, and, unlike Lightning,
/// which swaps the module's scheduler for SWALR, any scheduler of the module's;
/// a module with batch-norm layers needs bn_forward.
class FULGOR_API StochasticWeightAveraging : public Callback {
 public:
  explicit StochasticWeightAveraging(StochasticWeightAveragingOptions options);
  ~StochasticWeightAveraging() override;

  /// The averaged parameters, once averaging has begun (in parameters() order).
  const std::vector<torch::Tensor>& average() const { return average_; }
  int64_t n_averaged() const { return n_averaged_; }
  /// The 0-based epoch averaging starts at, once fit has started.
  int64_t swa_start() const;

  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  bool save_tensors(Trainer& trainer, ModuleBase& module, torch::serialize::OutputArchive& archive) override;
  void load_tensors(Trainer& trainer, ModuleBase& module, torch::serialize::InputArchive& archive) override;

  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_fit_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_epoch_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_epoch_end(Trainer& trainer, ModuleBase& module) override;
  void on_train_end(Trainer& trainer, ModuleBase& module) override;

 private:
  bool in_swa(int64_t epoch) const;
  void start_swa(Trainer& trainer);
  void update_average(const ModuleBase& module);
  void transfer_average(ModuleBase& module) const;

  StochasticWeightAveragingOptions options_;
  int64_t swa_epoch_start_ = 0;  // resolved at on_fit_start: 1-based
  int64_t max_epochs_ = -1;
  std::vector<torch::Tensor> average_;
  int64_t n_averaged_ = 0;
  int64_t latest_update_epoch_ = -1;
  std::unique_ptr<SWALR> scheduler_;
  std::optional<nlohmann::json> scheduler_state_;
};

}  // namespace fulgor
