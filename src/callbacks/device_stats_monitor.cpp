#include "fulgor/callbacks/device_stats_monitor.h"

#include <fmt/format.h>

#include <map>

#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fulgor/trainer.h"

namespace fulgor {

void DeviceStatsMonitor::setup(Trainer& trainer, ModuleBase&, const std::string& stage) {
  // fast_dev_run has no loggers by design, and then nothing is logged at all.
  if (stage != "predict" && trainer.loggers().empty() && trainer.options().fast_dev_run == 0)
    throw ConfigError(
        "DeviceStatsMonitor logs through the Trainer's loggers, but this Trainer has none (logger=false and no "
        "loggers): enable a logger or remove the callback");
}

// Lightning's _get_and_log_device_stats.
void DeviceStatsMonitor::log(Trainer& trainer, const char* hook) const {
  const torch::Device device = trainer.device();
  if (cpu_stats_ == false && device.is_cpu()) return;
  std::map<std::string, int64_t> stats = trainer.accelerator().memory_stats(device);
  if (cpu_stats_ == true && !device.is_cpu())
    stats.merge(make_accelerator("cpu")->memory_stats(torch::Device(torch::kCPU)));
  if (stats.empty()) return;
  std::map<std::string, double> metrics;
  for (const auto& [name, value] : stats)
    metrics[fmt::format("DeviceStatsMonitor.{}/{}", hook, name)] = static_cast<double>(value);
  trainer.log_metrics(metrics);
}

void DeviceStatsMonitor::on_train_batch_start(Trainer& trainer, ModuleBase&, int64_t) {
  if (trainer.logs_due()) log(trainer, "on_train_batch_start");
}

void DeviceStatsMonitor::on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor&, int64_t) {
  if (trainer.logs_due()) log(trainer, "on_train_batch_end");
}

void DeviceStatsMonitor::on_validation_batch_start(Trainer& trainer, ModuleBase&, int64_t) {
  log(trainer, "on_validation_batch_start");
}

void DeviceStatsMonitor::on_validation_batch_end(Trainer& trainer, ModuleBase&, int64_t) {
  log(trainer, "on_validation_batch_end");
}

void DeviceStatsMonitor::on_test_batch_start(Trainer& trainer, ModuleBase&, int64_t) {
  log(trainer, "on_test_batch_start");
}

void DeviceStatsMonitor::on_test_batch_end(Trainer& trainer, ModuleBase&, int64_t) {
  log(trainer, "on_test_batch_end");
}

}  // namespace fulgor
