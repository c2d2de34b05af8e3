#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <ostream>
#include <string>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// A table of a module's layers down to `max_depth` (name, type, parameter
/// count), then trainable, non-trainable and total parameters and their size in
/// MB, as Lightning's ModelSummary prints.
FULGOR_API std::string summarize(const torch::nn::Module& module, int64_t max_depth = 1);

/// Prints summarize(module) when fit starts.
class FULGOR_API ModelSummary : public Callback {
 public:
  explicit ModelSummary(int64_t max_depth = 1, std::ostream* out = nullptr) : max_depth_(max_depth), out_(out) {}
  bool summarizes_model() const override { return true; }
  void on_fit_start(Trainer& trainer, ModuleBase& module) override;

 private:
  int64_t max_depth_;
  std::ostream* out_;  // nullptr: std::cout
};

}  // namespace fulgor
