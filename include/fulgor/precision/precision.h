#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// A Trainer precision, as PyTorch Lightning names them:
///   "32-true" ("32")       float32 everywhere
///   "64-true" ("64")       float64 everywhere: the module is converted, inputs follow
///   "bf16-mixed" ("bf16")  float32 parameters; forward and loss under autocast in bfloat16
///   "16-mixed" ("16")      the same in float16, with dynamic loss scaling (GradScaler)
///   "bf16-true", "16-true" the module is converted to bfloat16 / float16, inputs follow
struct FULGOR_API Precision {
  std::string name;  ///< the canonical name, e.g. "bf16-mixed"
  bool mixed = false;
  torch::ScalarType dtype = torch::kFloat;  ///< compute dtype (autocast's, or the module's)

  /// Parses `value` (a canonical name or alias) for `accelerator`. Throws
  /// ConfigError for an unknown value, listing the known ones, and DeviceError
  /// when the accelerator does not support it, naming what it supports.
  static Precision parse(const std::string& value, const Accelerator& accelerator);
  /// The canonical names.
  static std::vector<std::string> known();

  bool needs_grad_scaler() const { return mixed && dtype == torch::kHalf; }
  /// Whether the module's floating-point parameters and buffers are converted.
  bool converts_module() const { return !mixed && dtype != torch::kFloat; }
  /// Converts a module for the "-true" precisions other than 32; a no-op otherwise.
  void convert_module(torch::nn::Module& module) const;
  /// Converts a floating-point input for the "-true" precisions; returns others unchanged.
  torch::Tensor convert_input(const torch::Tensor& input) const;
};

/// Runs the enclosed code under LibTorch's autocast for the accelerator's
/// autocast device type when `precision` is mixed; does nothing otherwise.
/// Restores the previous autocast state on exit.
class FULGOR_API AutocastScope {
 public:
  // The checks are inline: every training step makes one of these.
  AutocastScope(const Precision& precision, const Accelerator& accelerator) {
    if (precision.mixed) enter(precision, accelerator);
  }
  ~AutocastScope() {
    if (active_) exit();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  void enter(const Precision& precision, const Accelerator& accelerator);
  void exit();

  bool active_ = false;
  torch::DeviceType device_type_ = torch::kCPU;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat;
};

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

/// Dynamic loss scaling for float16 training, with torch.amp.GradScaler's
/// behaviour: the loss is multiplied by the scale before backward; before the
/// optimizer step the gradients are unscaled (before any clipping); a step
/// whose gradients hold inf or NaN is skipped and the scale backs off; after
/// growth_interval good steps in a row the scale grows.
///
/// Usage per optimizer step: scale(loss).backward(); unscale(optimizer);
/// [clip]; step(optimizer); update().
class FULGOR_API GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  torch::Tensor scale(const torch::Tensor& loss);
  /// Unscales the optimizer's gradients in place, once per step.
  void unscale(torch::optim::Optimizer& optimizer);
  /// Steps the optimizer unless this step's gradients were not finite;
  /// returns whether it stepped. Unscales first if unscale was not called.
  bool step(torch::optim::Optimizer& optimizer);
  /// Adjusts the scale after a step.
  void update();

  double get_scale() const;
  int64_t growth_tracker() const;
  const GradScalerOptions& options() const { return options_; }

  /// How unscale combines this process's count of non-finite gradients
  /// (a float32 tensor of one element, on the CPU) with the other ranks'.
  /// Under a sharded strategy each rank unscales its own pieces, so a
  /// non-finite gradient may lie in one rank's alone: the strategies set a
  /// sum over the ranks (PyTorch's ShardedGradScaler), and every rank skips
  /// that step and backs off alike. Empty: none (this process's alone).
  using FoundInfReduction = std::function<void(torch::Tensor& found_inf)>;
  void set_found_inf_reduction(FoundInfReduction reduction) { reduce_found_inf_ = std::move(reduction); }

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  GradScalerOptions options_;
  torch::Tensor scale_;           // float32 [1]
  torch::Tensor growth_tracker_;  // int32 [1]
  torch::Tensor found_inf_;       // float32 [1], this step's
  bool unscaled_ = false;
  FoundInfReduction reduce_found_inf_;
};

}  // namespace fulgor
