#include "fulgor/callbacks/throughput_monitor.h"

#include <fmt/format.h>

#include <chrono>
#include <numeric>
#include <utility>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/error.h"
#include "fulgor/trainer.h"

namespace fulgor {

namespace {

// Lightning's _MonotonicWindow.append.
template <typename T>
void append_increasing(std::deque<T>& window, size_t max, T value) {
  if (!window.empty() && window.back() >= value)
    throw Error(fmt::format("Expected the value to increase, last: {}, current: {}", window.back(), value));
  window.push_back(value);
  if (window.size() > max) window.pop_front();
}

}  // namespace

Throughput::Throughput(std::optional<double> available_flops, int64_t world_size, int64_t window_size,
                       std::string separator)
    : available_flops_(available_flops),
      world_size_(world_size),
      window_(static_cast<size_t>(window_size)),
      separator_(std::move(separator)) {
  if (world_size < 1) throw ConfigError(fmt::format("Throughput: world_size must be at least 1, not {}", world_size));
  // The rates look at the difference between the window's first and last values.
  if (window_size < 2)
    throw ConfigError(fmt::format("Throughput: window_size must be at least 2, not {}", window_size));
}

void Throughput::update(double time, int64_t batches, int64_t samples, std::optional<int64_t> lengths,
                        std::optional<double> flops) {
  append_increasing(time_, window_, time);
  if (samples < batches)
    throw Error(fmt::format("Expected samples ({}) to be greater or equal than batches ({})", samples, batches));
  append_increasing(batches_, window_, batches);
  append_increasing(samples_, window_, samples);
  if (lengths) {
    if (*lengths < samples)
      throw Error(fmt::format("Expected lengths ({}) to be greater or equal than samples ({})", *lengths, samples));
    append_increasing(lengths_, window_, *lengths);
    if (samples_.size() != lengths_.size())
      throw Error(fmt::format("If lengths are passed ({}), there needs to be the same number of samples ({})",
                              lengths_.size(), samples_.size()));
  }
  if (flops) {
    // Summed over the ranks, as Lightning's.
    flops_.push_back(*flops * static_cast<double>(world_size_));
    if (flops_.size() > window_) flops_.pop_front();
  }
}

std::map<std::string, double> Throughput::compute() const {
  const std::string device = "device" + separator_;
  const bool global = world_size_ > 1;
  const auto world = static_cast<double>(world_size_);
  std::map<std::string, double> m;
  if (time_.empty()) return m;
  m["time"] = time_.back();
  m["batches"] = static_cast<double>(batches_.back());
  m["samples"] = static_cast<double>(samples_.back());
  if (!lengths_.empty()) m["lengths"] = static_cast<double>(lengths_.back());
  const double elapsed_time = time_.back() - time_.front();
  if (time_.size() == window_) {
    const double batches_per_sec = static_cast<double>(batches_.back() - batches_.front()) / elapsed_time;
    const double samples_per_sec = static_cast<double>(samples_.back() - samples_.front()) / elapsed_time;
    m[device + "batches_per_sec"] = batches_per_sec;
    m[device + "samples_per_sec"] = samples_per_sec;
    if (global) {
      m["batches_per_sec"] = batches_per_sec * world;
      m["samples_per_sec"] = samples_per_sec * world;
    }
    if (lengths_.size() == window_) {
      const double items_per_sec = static_cast<double>(lengths_.back() - lengths_.front()) / elapsed_time;
      m[device + "items_per_sec"] = items_per_sec;
      if (global) m["items_per_sec"] = items_per_sec * world;
    }
  }
  if (flops_.size() == window_) {
    // Lightning's sum(flops) - flops[0]: the FLOPs done after the window's first update.
    const double flops = std::accumulate(flops_.begin(), flops_.end(), 0.0) - flops_.front();
    const double flops_per_sec = flops / elapsed_time;
    if (global) m["flops_per_sec"] = flops_per_sec;
    m[device + "flops_per_sec"] = flops_per_sec / world;
    if (available_flops_ && *available_flops_ != 0) m[device + "mfu"] = flops_per_sec / world / *available_flops_;
  }
  return m;
}

void Throughput::reset() {
  time_.clear();
  batches_.clear();
  samples_.clear();
  lengths_.clear();
  flops_.clear();
}

std::optional<double> Throughput::last_time() const {
  return time_.empty() ? std::nullopt : std::optional<double>(time_.back());
}

ThroughputMonitor::ThroughputMonitor(ThroughputMonitorOptions options) : options_(std::move(options)) {
  if (!options_.batch_size_fn)
    throw ConfigError("ThroughputMonitor needs a batch_size_fn: the number of samples in a batch");
  if (!options_.clock)
    options_.clock = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
  // Refuses a bad window now rather than when a loop starts.
  static_cast<void>(Throughput(options_.available_flops, 1, options_.window_size, options_.separator));
}

// One Throughput per stage this run can meet, as Lightning's setup.
void ThroughputMonitor::setup(Trainer& trainer, ModuleBase&, const std::string& stage) {
  const std::string running = stage == "fit" ? "train" : stage;
  auto fresh = [&] {
    return Throughput(options_.available_flops, trainer.world_size(), options_.window_size, options_.separator);
  };
  if (stage == "fit") stages_.insert_or_assign("validate", StageCounts{fresh()});
  // A new window, whose clock starts again, while the counts of validate, test
  // and predict go on over calls.
  if (auto it = stages_.find(running); it != stages_.end() && stage != "fit")
    it->second.throughput = fresh();
  else
    stages_.insert_or_assign(running, StageCounts{fresh()});
}

void ThroughputMonitor::start(Trainer& trainer, const std::string& stage) {
  if (!trainer.is_global_zero()) return;
  StageCounts& c = stages_.at(stage);
  if (trainer.stage() == "fit" || !c.started) {
    c.throughput.reset();
    c.batches = c.samples = c.lengths = 0;
  }
  c.started = true;
  c.t0 = options_.clock();
}

void ThroughputMonitor::update(Trainer& trainer, ModuleBase& module, const std::string& stage, const BatchEnd& end) {
  StageCounts& c = stages_.at(stage);
  // The clock would otherwise miss work still queued on the device.
  trainer.accelerator().synchronize(trainer.device());
  const double elapsed = options_.clock() - c.t0;
  if (options_.length_fn) c.lengths += options_.length_fn(end);
  c.samples += options_.batch_size_fn(end);
  c.batches += 1;
  std::optional<double> flops;
  if (options_.flops_per_batch) flops = options_.flops_per_batch(module);
  c.throughput.update(elapsed, c.batches, c.samples,
                      options_.length_fn ? std::optional<int64_t>(c.lengths) : std::nullopt, flops);
}

void ThroughputMonitor::log(Trainer& trainer, const std::string& stage) {
  std::map<std::string, double> metrics;
  for (const auto& [name, value] : stages_.at(stage).throughput.compute())
    metrics[stage + options_.separator + name] = value;
  trainer.log_metrics(metrics);
}

void ThroughputMonitor::on_train_start(Trainer& trainer, ModuleBase&) { start(trainer, "train"); }

void ThroughputMonitor::on_train_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) {
  if (!trainer.is_global_zero()) return;
  update(trainer, module, "train", end);
  // Once the window's optimizer step is done, so that its time is counted.
  if (trainer.logs_due()) log(trainer, "train");
}

void ThroughputMonitor::on_validation_start(Trainer& trainer, ModuleBase&) {
  if (!trainer.sanity_checking()) start(trainer, "validate");
}

void ThroughputMonitor::eval_batch_end(Trainer& trainer, ModuleBase& module, const std::string& stage,
                                       const BatchEnd& end) {
  if (!trainer.is_global_zero()) return;
  update(trainer, module, stage, end);
  const int64_t every = trainer.options().log_every_n_steps;
  if (every > 0 && ((end.batch_idx + 1) % every == 0 || trainer.should_stop())) log(trainer, stage);
}

void ThroughputMonitor::on_validation_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) {
  if (!trainer.sanity_checking()) eval_batch_end(trainer, module, "validate", end);
}

// Lightning's on_validation_end: training's clock skips the validation run.
void ThroughputMonitor::on_validation_end(Trainer& trainer, ModuleBase&) {
  if (!trainer.is_global_zero() || trainer.sanity_checking() || trainer.stage() != "fit") return;
  StageCounts& train = stages_.at("train");
  const StageCounts& val = stages_.at("validate");
  const double training_finished = train.t0 + train.throughput.last_time().value_or(0.0);
  const double between = val.t0 - training_finished;
  train.t0 += between + val.throughput.last_time().value_or(0.0);
}

void ThroughputMonitor::on_test_start(Trainer& trainer, ModuleBase&) { start(trainer, "test"); }

void ThroughputMonitor::on_test_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) {
  eval_batch_end(trainer, module, "test", end);
}

void ThroughputMonitor::on_predict_start(Trainer& trainer, ModuleBase&) { start(trainer, "predict"); }

void ThroughputMonitor::on_predict_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) {
  eval_batch_end(trainer, module, "predict", end);
}

}  // namespace fulgor
