#include "tuner/sweep.h"

#include <fmt/format.h>

#include <filesystem>
#include <random>
#include <system_error>
#include <utility>

#include "checkpoint/rng.h"

namespace fulgor::detail {

namespace {

std::map<std::string, double> metric_values(const MetricTable<double>& table) { return table.map(); }

void restore_metric_values(MetricTable<double>& table, const std::map<std::string, double>& values) {
  table.clear();
  for (const auto& [name, value] : values) table[name] = value;
}

// Lightning names it after a uuid that rank 0 broadcasts; under ddp every
// rank must read the file rank 0 wrote, so the name is fixed there.
std::string sweep_checkpoint_path(const TrainerState& s, const std::string& tag) {
  std::string name = "." + tag;
  if (!s.ddp) name += fmt::format("_{:016x}", std::random_device{}() * 0x100000000ull + std::random_device{}());
  return (std::filesystem::path(s.trainer.default_root_dir()) / (name + ".ckpt")).string();
}

}  // namespace

SweepScope::SweepScope(TrainerState& state, const std::string& tag, std::vector<std::shared_ptr<Callback>> callbacks)
    : s(state),
      path_(sweep_checkpoint_path(state, tag)),
      limits_(state.limits),
      epoch_progress_(state.fit_loop.epoch_progress),
      batch_progress_(state.fit_loop.epoch_loop.batch_progress),
      global_step_(state.fit_loop.epoch_loop.global_step),
      batches_that_stepped_(state.fit_loop.epoch_loop.batches_that_stepped),
      log_step_(state.metrics.log_step),
      num_training_batches_(state.fit_loop.num_training_batches),
      running_(state.running),
      should_stop_(state.should_stop),
      training_(state.module->is_training()),
      stop_reason_(state.stop_reason) {
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  s.checkpoints.save(path_);
  cpu_rng_ = cpu_rng_state();
  device_rng_ = s.accelerator->get_rng_state(s.device_setup->device);
  callback_metrics_ = metric_values(s.metrics.callback_metrics);
  progress_bar_metrics_ = metric_values(s.metrics.progress_bar_metrics);
  logged_metrics_ = metric_values(s.metrics.logged_metrics);
  callbacks_ = std::exchange(s.callbacks, std::move(callbacks));
  loggers_ = std::exchange(s.loggers, {});
  schedulers_ = std::exchange(s.optim.schedulers, {});
}

SweepScope::~SweepScope() {
  std::error_code ignored;
  if (s.trainer.is_global_zero()) std::filesystem::remove(path_, ignored);
}

void SweepScope::restore() {
  if (restored_) return;
  restored_ = true;
  s.callbacks = std::move(callbacks_);
  s.loggers = std::move(loggers_);
  s.optim.schedulers = std::move(schedulers_);
  s.limits = limits_;
  LoadedCheckpoint ckpt = s.checkpoints.read(path_);
  // Loading an optimizer's state overwrites the parameters' entries it has
  // and keeps the others: those the sweep began must go (at on_fit_start,
  // all of them).
  for (auto& optimizer : s.optim.optimizers) optimizer->state().clear();
  s.checkpoints.restore_module_and_callbacks(ckpt);
  s.checkpoints.restore_training_state(ckpt);
  s.fit_loop.forget_resume();
  auto& loop = s.fit_loop;
  loop.epoch_progress = epoch_progress_;
  loop.epoch_loop.batch_progress = batch_progress_;
  loop.epoch_loop.global_step = global_step_;
  loop.epoch_loop.batches_that_stepped = batches_that_stepped_;
  loop.num_training_batches = num_training_batches_;
  s.metrics.clear();
  s.metrics.train_accumulators.clear();
  restore_metric_values(s.metrics.callback_metrics, callback_metrics_);
  restore_metric_values(s.metrics.progress_bar_metrics, progress_bar_metrics_);
  restore_metric_values(s.metrics.logged_metrics, logged_metrics_);
  s.metrics.log_step = log_step_;
  s.running = running_;
  s.should_stop = should_stop_;
  s.stop_reason = stop_reason_;
  s.module->train(training_);
  set_cpu_rng_state(cpu_rng_);
  if (device_rng_.defined()) s.accelerator->set_rng_state(s.device_setup->device, device_rng_);
}

}  // namespace fulgor::detail
