#pragma once

#include <optional>
#include <string>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Logs the memory statistics of the Trainer's device (Accelerator::memory_stats)
/// around each batch, as Lightning's DeviceStatsMonitor does, under
/// `DeviceStatsMonitor.<hook>/<statistic>`, e.g.
/// `DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current` on CUDA
/// or `DeviceStatsMonitor.on_train_batch_start/process_resident_bytes` on the CPU.
///
/// Contract: logs through Trainer::log_metrics at the start and end of every
/// training batch whose logs are due (Trainer::logs_due: every
/// log_every_n_steps optimizer steps) and of every validation and test batch.
/// `cpu_stats` unset logs the CPU's statistics (the process's memory) only
/// where the device is the CPU; false never logs them; true adds them where
/// the device is another one. An accelerator without statistics logs nothing.
/// setup throws ConfigError when the Trainer has no logger (logger = false and
/// no loggers), except under fast_dev_run, which has none by design.
class FULGOR_API DeviceStatsMonitor : public Callback {
 public:
  explicit DeviceStatsMonitor(std::optional<bool> cpu_stats = std::nullopt) : cpu_stats_(cpu_stats) {}

  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_train_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_train_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor& loss, int64_t batch_idx) override;
  void on_validation_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_validation_batch_end(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_test_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_test_batch_end(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;

 private:
  void log(Trainer& trainer, const char* hook) const;
  std::optional<bool> cpu_stats_;
};

}  // namespace fulgor
