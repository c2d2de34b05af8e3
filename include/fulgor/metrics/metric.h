#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {
class ProcessGroup;
}

namespace fulgor::metrics {

/// A metric accumulated over batches, as torchmetrics' Metric: update() adds
/// a batch to the state, compute() gives the value over everything since the
/// last reset(), forward() (or calling the metric) does update() and returns
/// the value of that batch alone.
///
/// Contract:
///   - The state is a few tensors: counts and sums, which ranks combine by
///     adding them, and lists of values (AUROC's scores), which ranks combine
///     by concatenating them. A state starts on the CPU and moves to the
///     device of the first inputs given to update(); later inputs are on that
///     device (to() moves it). Neither update() nor compute() reads a value
///     on the host: they queue work on the device.
///   - compute() uses this process's state only. compute(group) is a
///     collective over the ranks of `group` (every rank calls it, with the
///     same metric): it computes the value over every rank's state (counts
///     summed, lists gathered), leaving each rank's own state as it was.
///     Logged with Module::log, a metric is computed at the end of the epoch,
///     over all ranks under strategy "ddp", then reset.
///   - Inputs are checked for their shapes and dtypes (ConfigError), not for
///     their values: a class index out of range fails in LibTorch's indexing.
///   - Not thread-safe.
class FULGOR_API Metric {
 public:
  virtual ~Metric() = default;

  /// The value over every batch since the last reset: a float64 tensor
  /// (ConfusionMatrix's counts: int64) on the state's device.
  torch::Tensor compute() const;
  /// The value over the state of every rank of `group` (a collective).
  torch::Tensor compute(ProcessGroup& group) const;
  /// Forgets every batch: the state is as constructed, on its device.
  void reset();
  /// Moves the state onto `device`.
  void to(torch::Device device);
  torch::Device device() const { return device_; }

  /// What the last forward() returned: the value of its batch alone
  /// (undefined before the first forward(), and after reset()).
  const torch::Tensor& batch_value() const { return batch_value_; }
  /// Batches given to update() or forward() since the last reset.
  int64_t update_count() const { return update_count_; }

 protected:
  Metric() = default;
  Metric(const Metric&) = default;
  Metric& operator=(const Metric&) = default;

  /// How the ranks' copies of a state are combined.
  enum class Merge { sum, cat };
  /// Registers a state, returning its index; `initial` is its value after
  /// reset(). A `cat` state is one-dimensional and starts empty.
  size_t add_state(torch::Tensor initial, Merge merge);
  /// A `sum` state, to update in place (`state(i).add_(...)`).
  torch::Tensor& state(size_t i) { return states_[i].value; }
  /// Appends `values` to a `cat` state.
  void append(size_t i, torch::Tensor values);

  /// Counts one batch and moves the state to `input`'s device; every update
  /// begins with it.
  void begin_update(const torch::Tensor& input);
  /// Runs `update` on an empty state to compute its batch's value, then adds
  /// that batch to the state (torchmetrics' forward without
  /// full_state_update). Returns the batch's value.
  torch::Tensor forward_with(const std::function<void()>& update);

  /// The value from the states in the order they were added (`cat` states
  /// concatenated).
  virtual torch::Tensor compute_from(const std::vector<torch::Tensor>& states) const = 0;

 private:
  struct State {
    torch::Tensor initial, value;      // value: a sum state's
    std::vector<torch::Tensor> parts;  // a cat state's appended values
    Merge merge;
  };
  std::vector<torch::Tensor> local_states() const;

  std::vector<State> states_;
  torch::Device device_{torch::kCPU};
  torch::Tensor batch_value_;
  int64_t update_count_ = 0;
};

/// A metric of predictions against targets.
class PredictionMetric : public Metric {
 public:
  void update(const torch::Tensor& preds, const torch::Tensor& target) {
    begin_update(preds);
    update_state(preds, target);
  }
  torch::Tensor forward(const torch::Tensor& preds, const torch::Tensor& target) {
    return forward_with([&] { update(preds, target); });
  }
  torch::Tensor operator()(const torch::Tensor& preds, const torch::Tensor& target) { return forward(preds, target); }

 protected:
  virtual void update_state(const torch::Tensor& preds, const torch::Tensor& target) = 0;
};

}  // namespace fulgor::metrics
