#pragma once

// The Trainer's side of precision: the parsed option, the module and input
// conversion of the "-true" precisions, and the loss scaling of "16-mixed".

#include <torch/data/example.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fulgor/accelerator.h"
#include "fulgor/precision.h"

namespace fulgor::detail {

/// Converts the floating-point tensors of a batch for a "-true" precision.
/// Walks the batch types move_batch knows (tensors, Examples, pairs, tuples,
/// vectors, maps); other types pass unchanged, since fulgor cannot see into
/// them: a module with such a batch converts its inputs itself, with
/// Precision::convert_input (see docs/precision.md).
template <typename T>
T convert_batch(T batch, const Precision& precision);

template <typename T, typename = void>
struct BatchConvert {
  static T convert(T batch, const Precision&) { return batch; }
};

template <>
struct BatchConvert<torch::Tensor> {
  static torch::Tensor convert(torch::Tensor t, const Precision& p) { return p.convert_input(t); }
};

template <typename Data, typename Target>
struct BatchConvert<torch::data::Example<Data, Target>> {
  static torch::data::Example<Data, Target> convert(torch::data::Example<Data, Target> e, const Precision& p) {
    e.data = convert_batch(std::move(e.data), p);
    // Targets are converted too, as Lightning does, so that a regression
    // loss sees matching dtypes; integer class labels are left as they are.
    e.target = convert_batch(std::move(e.target), p);
    return e;
  }
};

template <typename Data>
struct BatchConvert<torch::data::Example<Data, torch::data::example::NoTarget>> {
  using Example = torch::data::Example<Data, torch::data::example::NoTarget>;
  static Example convert(Example e, const Precision& p) {
    e.data = convert_batch(std::move(e.data), p);
    return e;
  }
};

template <typename A, typename B>
struct BatchConvert<std::pair<A, B>> {
  static std::pair<A, B> convert(std::pair<A, B> v, const Precision& p) {
    return {convert_batch(std::move(v.first), p), convert_batch(std::move(v.second), p)};
  }
};

template <typename... Ts>
struct BatchConvert<std::tuple<Ts...>> {
  static std::tuple<Ts...> convert(std::tuple<Ts...> t, const Precision& p) {
    return std::apply([&](auto&&... items) { return std::tuple<Ts...>(convert_batch(std::move(items), p)...); },
                      std::move(t));
  }
};

template <typename T, typename Alloc>
struct BatchConvert<std::vector<T, Alloc>> {
  static std::vector<T, Alloc> convert(std::vector<T, Alloc> v, const Precision& p) {
    for (auto& item : v) item = convert_batch(std::move(item), p);
    return v;
  }
};

template <typename K, typename V, typename... Rest>
struct BatchConvert<std::map<K, V, Rest...>> {
  static std::map<K, V, Rest...> convert(std::map<K, V, Rest...> m, const Precision& p) {
    for (auto& entry : m) entry.second = convert_batch(std::move(entry.second), p);
    return m;
  }
};

template <typename K, typename V, typename... Rest>
struct BatchConvert<std::unordered_map<K, V, Rest...>> {
  static std::unordered_map<K, V, Rest...> convert(std::unordered_map<K, V, Rest...> m, const Precision& p) {
    for (auto& entry : m) entry.second = convert_batch(std::move(entry.second), p);
    return m;
  }
};

template <typename T>
T convert_batch(T batch, const Precision& precision) {
  return BatchConvert<T>::convert(std::move(batch), precision);
}

/// The Trainer's precision. Without a GradScaler (every precision but
/// "16-mixed") scale_loss, unscale, step and update reduce to the plain
/// backward and optimizer step.
class PrecisionPlugin {
 public:
  /// Parses `value` for `accelerator` (see Precision::parse). The GradScaler is
  /// made on the first setup for "16-mixed" and kept across later loops of the
  /// same Trainer, as Lightning keeps its scaler.
  void setup(const std::string& value, const Accelerator& accelerator);

  const Precision& precision() const { return precision_; }
  /// The loss scaler; nullptr unless the precision is "16-mixed".
  const GradScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }

  // Inline, so that a precision without a scaler adds no calls to the
  // training step (Note [The per-step path] in src/trainer.cpp).

  /// The tensor to call backward on.
  torch::Tensor scale_loss(const torch::Tensor& loss) { return scaler_ ? scaler_->scale(loss) : loss; }
  /// Runs backward from `loss`, scaled.
  void backward(const torch::Tensor& loss) {
    if (scaler_)
      scaler_->scale(loss).backward();
    else
      loss.backward();
  }
  /// Unscales the optimizer's gradients, so that clipping and the optimizer see true values.
  void unscale(torch::optim::Optimizer& optimizer) {
    if (scaler_) scaler_->unscale(optimizer);
  }
  /// Steps the optimizer unless the scaler found inf/NaN gradients; returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer) {
    if (scaler_) return scaler_->step(optimizer);
    optimizer.step();
    return true;
  }
  /// Adjusts the loss scale once all optimizers have stepped.
  void update() {
    if (scaler_) scaler_->update();
  }

  /// Writes the scaler's state into `archive` under "grad_scaler"; nothing without a scaler.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Restores the scaler's state from a checkpoint written by save. A
  /// checkpoint without one (saved at another precision) leaves the scaler fresh.
  void load(torch::serialize::InputArchive& archive, const std::string& path);

 private:
  Precision precision_{"32-true", false, torch::kFloat};
  std::optional<GradScaler> scaler_;
};

}  // namespace fulgor::detail
