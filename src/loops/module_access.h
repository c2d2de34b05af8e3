#pragma once

// The Trainer's access to a module's private links to it.

#include <utility>
#include <vector>

#include "fulgor/data_module.h"
#include "fulgor/module.h"

namespace fulgor::detail {

struct DataModuleAccess {
  static void attach(DataModuleBase& datamodule, Trainer* trainer) { datamodule.trainer_ = trainer; }
};

struct ModuleAccess {
  static void attach(ModuleBase& module, MetricSink* sink, Trainer* trainer, const OptimizerConfig* optim) {
    module.sink_ = sink;
    module.trainer_ = trainer;
    module.optim_ = optim;
  }
  static void set_manual(ModuleBase& module, ManualSteps* steps, std::vector<ManualOptimizer> optimizers) {
    module.manual_steps_ = steps;
    module.manual_optimizers_ = std::move(optimizers);
    module.toggled_.clear();
  }
  static void set_sharded_gradient_norm(ModuleBase& module,
                                        std::function<double(const std::vector<torch::Tensor>&)> norm) {
    module.sharded_gradient_norm_ = std::move(norm);
  }
  static void record_mode(ModuleBase& module) { module.training_before_evaluation_ = module.is_training(); }
  static bool mode_before_evaluation(const ModuleBase& module) { return module.training_before_evaluation_; }
};

}  // namespace fulgor::detail
