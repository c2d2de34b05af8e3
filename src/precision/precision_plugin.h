#pragma once

// The precision plugin the Trainer and Fabric share (Lightning's Precision
// plugins): the parsed option and the loss scaling of "16-mixed".

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <optional>
#include <string>

#include "fulgor/core/accelerator.h"
#include "fulgor/module.h"
#include "fulgor/precision/precision.h"

namespace fulgor::detail {

/// The precision of a Trainer or a Fabric. Without a GradScaler (every
/// precision but "16-mixed") scaling, unscaling, stepping and updating
/// reduce to the plain loss and optimizer step.
class PrecisionPlugin {
 public:
  /// Parses `value` for `accelerator` (see Precision::parse). The GradScaler is
  /// made on the first setup for "16-mixed" and kept across later loops of the
  /// same Trainer.
  void setup(const std::string& value, const Accelerator& accelerator);

  const Precision& precision() const { return precision_; }
  /// The loss scaler; nullptr unless the precision is "16-mixed".
  GradScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
  const GradScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }

  // Inline, so that a precision without a scaler adds no calls to the
  // training step (Note [The per-step path] in src/loops/training_epoch_loop.cpp).

  /// The loss to run backward from: scaled by the GradScaler, if any.
  torch::Tensor scale(const torch::Tensor& loss) { return scaler_ ? scaler_->scale(loss) : loss; }
  /// Runs the module's backward hook from `loss`, scaled.
  void backward(const torch::Tensor& loss, ModuleBase& module) { module.backward(scale(loss)); }
  /// Unscales the optimizer's gradients, so that clipping and the optimizer see true values.
  void unscale(torch::optim::Optimizer& optimizer) {
    if (scaler_) scaler_->unscale(optimizer);
  }
  /// Steps the optimizer unless the scaler found inf/NaN gradients; returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer) {
    if (scaler_) return scaler_->step(optimizer);
    optimizer.step();
    return true;
  }
  /// Adjusts the loss scale once all optimizers have stepped.
  void update() {
    if (scaler_) scaler_->update();
  }

  /// Writes the scaler's state into `archive` under "grad_scaler"; nothing without a scaler.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Restores the scaler's state from a checkpoint written by save. A
  /// checkpoint without one (saved at another precision) leaves the scaler fresh.
  void load(torch::serialize::InputArchive& archive, const std::string& path);

 private:
  Precision precision_{"32-true", false, torch::kFloat};
  std::optional<GradScaler> scaler_;
};

}  // namespace fulgor::detail
