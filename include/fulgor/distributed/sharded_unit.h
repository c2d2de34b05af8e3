#pragma once

// A unit of fully sharded training: the module whose parameters strategy
// "fsdp" with sharding_strategy "FULL_SHARD" gathers for its forward and
// backward passes only (docs/distributed.md, "Sharded training").

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

namespace detail {
class UnitSharding;
struct ShardedUnitAccess;
}  // namespace detail

/// How a unit runs.
struct ShardedOptions {
  /// Lightning's activation_checkpointing_policy for this unit (PyTorch's
  /// checkpoint): the unit keeps none of its activations for backward, which
  /// runs its forward again, with the random generators and autocast as they
  /// were the first time, so that the gradients are those without it. Under
  /// any strategy, one process included; without grad mode the forward runs
  /// once. Needs a forward whose arguments can be copied and whose result is
  /// tensors (ConfigError at a forward under grad mode otherwise).
  bool checkpoint_activations = false;
  /// FSDP2's option of that name, under FULL_SHARD: whether the unit's
  /// parameters are released when its forward ends and gathered again for
  /// its backward (true), or kept gathered until its backward has reduced
  /// their gradients (false: one all-gather a step instead of two, for the
  /// memory of the unit's parameters from forward to backward). Without
  /// grad mode they are released after the forward either way.
  bool reshard_after_forward = true;
};

/// The part of every fulgor::Sharded that does not depend on the wrapped
/// module's type.
///
/// Contract:
///   - requires: the wrapped module's parameters and buffers are registered
///     when it is wrapped, and each parameter owns its storage (it is no view
///     of another tensor).
///   - ensures: the unit holds the wrapped module's own parameters, buffers
///     and submodules under their own names, so that parameter names, state
///     dicts and checkpoints are the unwrapped module's; train() and eval()
///     reach the wrapped module.
///   - Without a strategy that shards the parameters (one process, ddp,
///     SHARD_GRAD_OP, NO_SHARD, or outside a fit) forward is the wrapped
///     module's, untouched.
///   - Under FULL_SHARD (Note [Fully sharded units] in
///     src/distributed/parameter_shards.h): between its passes the unit's
///     parameters hold no memory (their storage is released; shapes stay); a
///     forward pass gathers them from the ranks' pieces, runs, and releases
///     them; in backward they are gathered again before the unit's gradients
///     are computed, which are then reduce-scattered into the pieces and
///     released with the parameters (with options().reshard_after_forward
///     false, kept from the forward to the end of the backward instead).
///     Every rank must run the same units in the same order, as every
///     collective. HYBRID_SHARD does the same over the ranks of each node.
///     Under "bf16-mixed" or "16-mixed" the parameters are gathered in that
///     dtype and the floating-point tensor arguments cast to it, so that
///     the forward computes in it (FSDP's MixedPrecision).
///   - With options().checkpoint_activations, under grad mode, the forward
///     keeps no activations and backward runs it again (Note [Checkpointed
///     units] in src/distributed/sharded_unit.cpp), under FULL_SHARD between
///     the gathering and the reduction of the unit's backward.
class FULGOR_API ShardedUnit : public torch::nn::Module {
 public:
  /// Whether a strategy shards this unit's parameters now.
  bool sharded() const { return sharding_ != nullptr; }
  const ShardedOptions& options() const { return options_; }

  void train(bool on = true) override;
  void pretty_print(std::ostream& stream) const override;

 protected:
  ShardedUnit(std::shared_ptr<torch::nn::Module> module, ShardedOptions options);

  /// The tensors a forward pass returns, from the tensors among its
  /// arguments.
  using Run = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;
  /// Whether this pass checkpoints its activations: the option, under grad
  /// mode. `replayable`: whether the forward can run again (ConfigError
  /// where the option asks for it and it cannot).
  bool checkpoints(bool replayable) const;
  /// `first(inputs)`, run without keeping activations; backward runs
  /// `again` on the inputs, under the random generators' states `first`
  /// began with, and takes the gradients from it.
  std::vector<torch::Tensor> checkpointed(const std::vector<torch::Tensor>& inputs, const Run& first, Run again);

  /// Gathers the parameters and routes `inputs` (the tensors among forward's
  /// arguments) through the step that reduces the unit's gradients once
  /// backward has computed them.
  std::vector<torch::Tensor> before_forward(std::vector<torch::Tensor> inputs);
  /// Routes `outputs` through the step that gathers the parameters again in
  /// backward, then releases them. `routed`: whether `outputs` are every
  /// tensor forward returned; where not, the parameters stay gathered until
  /// the unit's backward has run.
  std::vector<torch::Tensor> after_forward(std::vector<torch::Tensor> outputs, bool routed);

 private:
  friend struct detail::ShardedUnitAccess;
  std::shared_ptr<torch::nn::Module> module_;
  ShardedOptions options_;
  std::shared_ptr<detail::UnitSharding> sharding_;
};

namespace detail {

template <typename T>
constexpr bool is_tensor_v = std::is_same_v<std::decay_t<T>, torch::Tensor>;

// A forward argument as the unit passes it on: tensors by value (routed),
// anything else as it came.
template <typename A>
using PassedArgument = std::conditional_t<is_tensor_v<A>, torch::Tensor, A&&>;

// Whether a forward argument of type A can be kept and passed again (a
// checkpointed unit's forward runs twice): a copy binds to it.
template <typename A>
constexpr bool replayable_v = is_tensor_v<A> ||
                              (std::is_copy_constructible_v<std::decay_t<A>> &&
                               !(std::is_lvalue_reference_v<A> && !std::is_const_v<std::remove_reference_t<A>>));

template <typename R>
struct RoutedTensors {  // anything else: nothing routed
  static constexpr bool all = false;
  static void collect(const R&, std::vector<torch::Tensor>&) {}
  static void replace(R&, const std::vector<torch::Tensor>&, size_t&) {}
};

template <>
struct RoutedTensors<torch::Tensor> {
  static constexpr bool all = true;
  static void collect(const torch::Tensor& t, std::vector<torch::Tensor>& out) { out.push_back(t); }
  static void replace(torch::Tensor& t, const std::vector<torch::Tensor>& in, size_t& next) { t = in[next++]; }
};

template <>
struct RoutedTensors<std::vector<torch::Tensor>> {
  static constexpr bool all = true;
  static void collect(const std::vector<torch::Tensor>& ts, std::vector<torch::Tensor>& out) {
    out.insert(out.end(), ts.begin(), ts.end());
  }
  static void replace(std::vector<torch::Tensor>& ts, const std::vector<torch::Tensor>& in, size_t& next) {
    for (auto& t : ts) t = in[next++];
  }
};

template <typename... T>
struct RoutedTensors<std::tuple<T...>> {
  static constexpr bool all = (RoutedTensors<T>::all && ...);
  static void collect(const std::tuple<T...>& ts, std::vector<torch::Tensor>& out) {
    std::apply([&](const auto&... t) { (RoutedTensors<T>::collect(t, out), ...); }, ts);
  }
  static void replace(std::tuple<T...>& ts, const std::vector<torch::Tensor>& in, size_t& next) {
    std::apply([&](auto&... t) { (RoutedTensors<T>::replace(t, in, next), ...); }, ts);
  }
};

}  // namespace detail

template <typename Impl, typename Forward = decltype(&Impl::forward)>
class ShardedImpl;

/// The unit around a module of type Impl (LinearImpl, a user's BlockImpl),
/// with Impl's forward signature, so that it stands wherever the module did,
/// in a torch::nn::Sequential too. Use it through fulgor::Sharded.
template <typename Impl, typename Owner, typename R, typename... A>
class ShardedImpl<Impl, R (Owner::*)(A...)> : public ShardedUnit {
 public:
  explicit ShardedImpl(std::shared_ptr<Impl> module, ShardedOptions options = {})
      : ShardedUnit(module, options), module_(std::move(module)) {}
  explicit ShardedImpl(const torch::nn::ModuleHolder<Impl>& module, ShardedOptions options = {})
      : ShardedImpl(module.ptr(), options) {}

  R forward(A... args) {
    constexpr bool replayable = detail::RoutedTensors<R>::all && (detail::replayable_v<A> && ...);
    const bool checkpoint = checkpoints(replayable);
    if (!sharded() && !checkpoint) return module_->forward(std::forward<A>(args)...);
    std::vector<torch::Tensor> inputs;
    (collect(args, inputs), ...);
    inputs = before_forward(std::move(inputs));
    if constexpr (replayable) {
      if (checkpoint) return finish(checkpointed_forward(inputs, args...));
    }
    size_t next = 0;
    // A braced list evaluates its elements in order: each tensor argument
    // takes its routed tensor.
    std::tuple<detail::PassedArgument<A>...> passed{pass<A>(std::forward<A>(args), inputs, next)...};
    return finish(
        std::apply([&](auto&&... a) { return module_->forward(std::forward<decltype(a)>(a)...); }, std::move(passed)));
  }

  /// The wrapped module.
  const std::shared_ptr<Impl>& module() const { return module_; }

 private:
  using Kept = std::tuple<std::decay_t<A>...>;

  template <typename T>
  static void collect(const T& arg, std::vector<torch::Tensor>& out) {
    if constexpr (detail::is_tensor_v<T>) out.push_back(arg);
  }
  template <typename T, typename U>
  static detail::PassedArgument<T> pass(U&& arg, const std::vector<torch::Tensor>& routed, size_t& next) {
    if constexpr (detail::is_tensor_v<T>)
      return routed[next++];
    else
      return std::forward<U>(arg);
  }

  // `result` with its tensors routed (after_forward).
  R finish(R result) {
    std::vector<torch::Tensor> outputs;
    detail::RoutedTensors<R>::collect(result, outputs);
    outputs = after_forward(std::move(outputs), detail::RoutedTensors<R>::all);
    size_t next = 0;
    detail::RoutedTensors<R>::replace(result, outputs, next);
    return result;
  }

  // The forward on copies of the other arguments, the tensors from `tensors`.
  static R run(Impl& module, const Kept& kept, const std::vector<torch::Tensor>& tensors) {
    return std::apply(
        [&](const auto&... a) {
          size_t next = 0;
          std::tuple<std::conditional_t<detail::is_tensor_v<A>, torch::Tensor, std::decay_t<A>>...> passed{
              replay<A>(a, tensors, next)...};
          return std::apply([&](auto&&... p) { return module.forward(std::forward<decltype(p)>(p)...); },
                            std::move(passed));
        },
        kept);
  }
  // A copy of an argument that is no tensor (the tensors are the recompute's
  // inputs, kept as such).
  template <typename T>
  static std::decay_t<T> keep(const std::decay_t<T>& arg) {
    if constexpr (detail::is_tensor_v<T>)
      return {};
    else
      return arg;
  }
  template <typename T, typename U>
  static auto replay(const U& kept, const std::vector<torch::Tensor>& tensors, size_t& next) {
    if constexpr (detail::is_tensor_v<T>)
      return tensors[next++];
    else
      return kept;
  }

  // The forward without its activations kept: backward runs it again on
  // copies of the arguments (checkpointed).
  R checkpointed_forward(const std::vector<torch::Tensor>& inputs, const A&... args) {
    auto kept = std::make_shared<Kept>(keep<A>(args)...);
    std::optional<R> first;
    const std::vector<torch::Tensor> outputs = checkpointed(
        inputs,
        [&](const std::vector<torch::Tensor>& tensors) {
          first.emplace(run(*module_, *kept, tensors));
          std::vector<torch::Tensor> out;
          detail::RoutedTensors<R>::collect(*first, out);
          return out;
        },
        [module = module_, kept](const std::vector<torch::Tensor>& tensors) {
          std::vector<torch::Tensor> out;
          detail::RoutedTensors<R>::collect(run(*module, *kept, tensors), out);
          return out;
        });
    size_t next = 0;
    detail::RoutedTensors<R>::replace(*first, outputs, next);
    return std::move(*first);
  }

  std::shared_ptr<Impl> module_;
};

template <typename Impl, typename Owner, typename R, typename... A>
class ShardedImpl<Impl, R (Owner::*)(A...) const> : public ShardedImpl<Impl, R (Owner::*)(A...)> {
  using ShardedImpl<Impl, R (Owner::*)(A...)>::ShardedImpl;
};

namespace detail {
template <typename M>
struct ImplOf {
  using type = typename M::ContainedType;  // a ModuleHolder: torch::nn::Linear
};
template <typename T>
struct ImplOf<std::shared_ptr<T>> {
  using type = T;
};
}  // namespace detail

/// A module made a unit of fully sharded training (FSDP2's fully_shard in
/// C++), where C++ modules have no forward hooks: the unit is the module's
/// stand-in, and the parent calls the unit.
///
///     block = register_module("block", fulgor::Sharded(Block(64)));
///     layers = register_module("layers", torch::nn::Sequential(
///         fulgor::Sharded(torch::nn::Linear(512, 512)), torch::nn::ReLU()));
///
///     fulgor::ShardedOptions checkpointed;  // C++20: {.checkpoint_activations = true}
///     checkpointed.checkpoint_activations = true;
///     block = register_module("block", fulgor::Sharded(Block(64), checkpointed));
///
/// M is a module holder (torch::nn::Linear, a TORCH_MODULE) or a
/// std::shared_ptr to a module; its forward must not be overloaded.
template <typename M>
class Sharded : public torch::nn::ModuleHolder<ShardedImpl<typename detail::ImplOf<M>::type>> {
  using Holder = torch::nn::ModuleHolder<ShardedImpl<typename detail::ImplOf<M>::type>>;

 public:
  using Holder::Holder;
  Sharded(const M& module, ShardedOptions options)
      : Holder(std::make_shared<ShardedImpl<typename detail::ImplOf<M>::type>>(module, options)) {}
};

template <typename M>
Sharded(M) -> Sharded<M>;

}  // namespace fulgor
