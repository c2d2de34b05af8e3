#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Lightning's Throughput (lightning.fabric.utilities.throughput): rolling
/// rates over the last `window_size` updates of running totals.
///
/// Contract: update() takes the totals since the start (time in seconds,
/// batches, samples, optionally lengths) and the FLOPs of this update's
/// batch on one device; each total must increase with every update, samples
/// be at least batches and lengths at least samples (Error otherwise, with
/// Lightning's messages). compute() gives `time`, `batches`, `samples`
/// (`lengths`) always; once the window is full `device/batches_per_sec`,
/// `device/samples_per_sec` (and `device/items_per_sec` when lengths are
/// given), and with world_size > 1 the totals over the job, `batches_per_sec`,
/// `samples_per_sec`, `items_per_sec`; once the window holds as many FLOPs
/// counts, `device/flops_per_sec` (`flops_per_sec` with world_size > 1), and
/// `device/mfu` when available_flops is set. "/" is the separator.
class FULGOR_API Throughput {
 public:
  /// available_flops: one device's peak FLOP/s; world_size >= 1; window_size >= 2.
  explicit Throughput(std::optional<double> available_flops = std::nullopt, int64_t world_size = 1,
                      int64_t window_size = 100, std::string separator = "/");

  void update(double time, int64_t batches, int64_t samples, std::optional<int64_t> lengths = std::nullopt,
              std::optional<double> flops = std::nullopt);
  std::map<std::string, double> compute() const;
  void reset();
  /// The last update's time (nullopt before any).
  std::optional<double> last_time() const;

 private:
  std::optional<double> available_flops_;
  int64_t world_size_;
  size_t window_;
  std::string separator_;
  std::deque<double> time_;
  std::deque<int64_t> batches_, samples_, lengths_;
  std::deque<double> flops_;
};

/// Options of ThroughputMonitor (Lightning's arguments and its Throughput's).
struct FULGOR_API ThroughputMonitorOptions {
  /// The samples in a batch (required).
  std::function<int64_t(const BatchEnd&)> batch_size_fn;
  /// The items (tokens, pixels) in a batch: adds the `items_per_sec` rates.
  std::function<int64_t(const BatchEnd&)> length_fn;
  /// The FLOPs of one batch on one device, which Lightning reads from the
  /// module's `flops_per_batch` attribute: adds the `flops_per_sec` rates.
  std::function<double(const ModuleBase&)> flops_per_batch;
  /// One device's peak FLOP/s, for `device/mfu` (Lightning looks it up by
  /// device name; fulgor takes it from the user).
  std::optional<double> available_flops;
  int64_t window_size = 100;
  std::string separator = "/";
  /// Seconds since any fixed point; default: std::chrono::steady_clock.
  std::function<double()> clock;
};

/// Logs the throughput of each loop (Lightning's ThroughputMonitor): every
/// metric of Throughput::compute(), named `<stage><separator><metric>` with
/// stage "train", "validate", "test" or "predict" (`train/device/samples_per_sec`).
///
/// Contract: on rank 0 only, with world_size the job's. Training is measured
/// from on_train_start, each evaluation loop from its start; the device is
/// synchronized (Accelerator::synchronize) before the clock is read at each
/// batch end. Training batches log when their logs are due
/// (Trainer::logs_due: the end of an accumulation window at
/// log_every_n_steps); evaluation and prediction batches when their count in
/// the loop is a multiple of log_every_n_steps. The time fit spends validating
/// is taken out of the training time. Validation inside fit starts again at
/// each run; validate, test and predict keep counting batches and samples over
/// calls, with a new window and clock at each, as Lightning's. The sanity
/// check is not measured. The metrics go to the loggers at the Trainer's
/// logging step (Lightning logs the evaluation loops' at their batch count). No batch_size_fn is a ConfigError.
class FULGOR_API ThroughputMonitor : public Callback {
 public:
  explicit ThroughputMonitor(ThroughputMonitorOptions options);

  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_train_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;
  void on_validation_start(Trainer& trainer, ModuleBase& module) override;
  void on_validation_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;
  void on_validation_end(Trainer& trainer, ModuleBase& module) override;
  void on_test_start(Trainer& trainer, ModuleBase& module) override;
  void on_test_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;
  void on_predict_start(Trainer& trainer, ModuleBase& module) override;
  void on_predict_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;

 private:
  struct StageCounts {
    Throughput throughput;
    double t0 = 0;
    int64_t batches = 0, samples = 0, lengths = 0;
    bool started = false;
  };
  void start(Trainer& trainer, const std::string& stage);
  void update(Trainer& trainer, ModuleBase& module, const std::string& stage, const BatchEnd& end);
  void log(Trainer& trainer, const std::string& stage);
  void eval_batch_end(Trainer& trainer, ModuleBase& module, const std::string& stage, const BatchEnd& end);

  ThroughputMonitorOptions options_;
  std::map<std::string, StageCounts> stages_;
};

}  // namespace fulgor
