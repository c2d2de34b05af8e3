#pragma once

#include <cstdint>
#include <map>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Changes how many batches each optimizer step accumulates, by epoch
/// (Lightning's GradientAccumulationScheduler): `{{0, 1}, {4, 2}}` steps
/// every batch for epochs 0 to 3 and every 2 batches from epoch 4 (epochs
/// count from 0; a schedule without epoch 0 starts at 1).
///
/// Contract: sets Trainer::set_accumulate_grad_batches at each
/// on_train_epoch_start. Refuses with a ConfigError, as Lightning: an empty
/// schedule, an epoch below 0, a factor below 1 (when made); a module that
/// optimizes manually and a Trainer whose option accumulate_grad_batches is
/// not 1 (when training starts). Keeps no state: the epoch gives the factor.
class FULGOR_API GradientAccumulationScheduler : public Callback {
 public:
  explicit GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling);

  /// The factor for `epoch`.
  int64_t get_accumulate_grad_batches(int64_t epoch) const;
  /// Whether any epoch accumulates more than one batch.
  bool going_to_accumulate_grad_batches() const;
  const std::map<int64_t, int64_t>& scheduling() const { return scheduling_; }

  void on_train_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_epoch_start(Trainer& trainer, ModuleBase& module) override;

 private:
  std::map<int64_t, int64_t> scheduling_;
};

}  // namespace fulgor
