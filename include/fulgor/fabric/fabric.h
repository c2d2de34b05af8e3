#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/batch.h"
#include "fulgor/core/devices.h"
#include "fulgor/core/export.h"
#include "fulgor/data/any_loader.h"
#include "fulgor/data/loader_protocol.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/distributed/process_group.h"
#include "fulgor/fabric/fabric_callback.h"
#include "fulgor/fabric/fabric_state.h"
#include "fulgor/loggers/logger.h"
#include "fulgor/optim/zero_grad.h"
#include "fulgor/precision/precision.h"

namespace fulgor {

class Fabric;

namespace detail {
struct FabricModule;
class PrecisionPlugin;
}

/// What a Fabric runs on, with Lightning Fabric's names and defaults. The
/// fields are in the order C++20's designated initializers need:
///   fulgor::Fabric fabric({.accelerator = "cpu", .devices = 2, .strategy = "ddp"});
struct FabricOptions {
  /// A registered accelerator's name, "auto" or "gpu" (AcceleratorRegistry).
  std::string accelerator = "auto";
  /// Devices of this node, with the Trainer's meanings (fulgor::Devices).
  Devices devices = "auto";
  /// "32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"
  /// or their aliases (fulgor::Precision); Lightning's default is "32-true".
  std::string precision = "32-true";
  /// "auto", "ddp", "fsdp" or "single_device", as the Trainer's; "fsdp" is
  /// ddp's processes with the optimizers' state, the gradients and the
  /// parameters sharded over the ranks (sharding_strategy;
  /// docs/distributed.md).
  std::string strategy = "auto";
  /// Under strategy "fsdp", what is sharded, as the Trainer's option, in any
  /// case: "FULL_SHARD" (Lightning's default, ZeRO-3: the parameters of the
  /// set-up modules' fulgor::Sharded units too, between their passes; keep
  /// the Fabric while the module is used), "SHARD_GRAD_OP" (the gradients
  /// and the optimizers' state, ZeRO-2), "NO_SHARD" (nothing: ddp) or
  /// "HYBRID_SHARD" (FULL_SHARD within each node, replicated across nodes).
  std::string sharding_strategy = "FULL_SHARD";
  /// Under strategy "ddp", the optimizers' state sharded over the ranks
  /// (ZeRO-1), as the Trainer's option.
  bool zero_redundancy_optimizer = false;
  /// What save() writes, as the Trainer's option: "full" (one file, the
  /// state whole, written by rank 0) or "sharded" (a distributed
  /// checkpoint's folder that every rank writes its part of; the modules'
  /// and the optimizers' states in PyTorch's layout, the optimizers SGD,
  /// Adam or AdamW). load() reads either.
  std::string state_dict_type = "full";
  /// Nodes of the job; more than one needs a launcher on every node
  /// (torchrun, fulgor-run, srun) whose world size is num_nodes times the
  /// processes of each node.
  int64_t num_nodes = 1;
  /// What call() runs hooks of (FabricCallback), in this order.
  std::vector<std::shared_ptr<FabricCallback>> callbacks = {};
  /// Where log() and log_dict() send metrics; only rank 0's write.
  std::vector<std::shared_ptr<Logger>> loggers = {};
  /// How long a rendezvous or collective may take, in seconds (Lightning's 30 minutes).
  std::optional<double> ddp_timeout = std::nullopt;
};

/// An optimizer set up by Fabric::setup (Lightning's _FabricOptimizer):
/// step() steps it through the precision, which under "16-mixed" unscales
/// the gradients, skips a step whose gradients are not finite and updates
/// the loss scale, and which under sharding gathers the stepped pieces into
/// the parameters (operator-> reaches the bare optimizer, whose step does
/// neither). A handle: it refers to the optimizer and the Fabric, which must
/// outlive it.
class FULGOR_API FabricOptimizer {
 public:
  FabricOptimizer(Fabric& fabric, torch::optim::Optimizer& optimizer) : fabric_(&fabric), optimizer_(&optimizer) {}
  /// Steps the optimizer; returns whether it stepped (false only when the
  /// "16-mixed" loss scaler skipped the step).
  bool step();
  /// Sets the gradients to none (fulgor::zero_grad), as PyTorch 2's
  /// optimizer.zero_grad() does.
  void zero_grad(bool set_to_none = true) { fulgor::zero_grad(*optimizer_, set_to_none); }
  torch::optim::Optimizer& optimizer() const { return *optimizer_; }
  torch::optim::Optimizer* operator->() const { return optimizer_; }

 private:
  Fabric* fabric_;
  torch::optim::Optimizer* optimizer_;
};

namespace detail {
// What FabricDataLoader iterates: the loader, or the one its pointer holds.
template <typename Loader>
using LoaderOf = std::remove_reference_t<decltype(held_loader(std::declval<Loader&>()))>;
template <typename Loader, typename = void>
struct is_iterable : std::false_type {};
template <typename Loader>
struct is_iterable<Loader, std::void_t<decltype(std::declval<Loader&>().begin() != std::declval<Loader&>().end()),
                                       decltype(*std::declval<Loader&>().begin())>> : std::true_type {};
}  // namespace detail

/// A loader set up by Fabric::setup_dataloaders (Lightning's
/// _FabricDataLoader): this rank's shard of the loader's data, each batch
/// moved onto the Fabric's device. It forwards size() and set_epoch() where
/// the loader has them. The loader is held by value, or through the
/// std::unique_ptr or std::shared_ptr it came in (torch::data::make_data_loader's).
template <typename Loader>
class FabricDataLoader {
  using Held = detail::LoaderOf<Loader>;
  using InnerIterator = decltype(std::declval<Held&>().begin());

 public:
  using Batch = std::decay_t<decltype(*std::declval<InnerIterator&>())>;

  FabricDataLoader(Loader loader, const Accelerator* accelerator, torch::Device device)
      : loader_(std::move(loader)), accelerator_(accelerator), device_(device) {}

  class Iterator : public detail::BatchIterator<Iterator, Batch> {
   public:
    Iterator(InnerIterator inner, const FabricDataLoader* owner) : inner_(std::move(inner)), owner_(owner) {}
    Batch& operator*() {
      if (!batch_) batch_ = owner_->on_device(*inner_);
      return *batch_;
    }
    Iterator& operator++() {
      batch_.reset();
      ++inner_;
      return *this;
    }
    bool operator==(const Iterator& other) const { return inner_ == other.inner_; }

   private:
    InnerIterator inner_;
    const FabricDataLoader* owner_;
    std::optional<Batch> batch_;
  };

  Iterator begin() { return Iterator(loader().begin(), this); }
  Iterator end() { return Iterator(loader().end(), this); }

  template <typename L = Held, typename = std::enable_if_t<detail::HasSize<L>::value>>
  int64_t size() const {
    return static_cast<int64_t>(detail::held_loader(loader_).size());
  }
  template <typename L = Held, typename = std::enable_if_t<detail::has_set_epoch<L>::value>>
  void set_epoch(int64_t epoch) {
    loader().set_epoch(epoch);
  }
  /// The loader as set up (sharded).
  Held& loader() { return detail::held_loader(loader_); }

 private:
  Batch on_device(const Batch& batch) const {
    if (accelerator_ == nullptr) return batch;
    if constexpr (detail::has_batches_on<Held>::value)
      if (detail::held_loader(loader_).batches_on(device_)) return batch;
    return move_batch(batch, *accelerator_, device_);
  }

  Loader loader_;
  const Accelerator* accelerator_;  // nullptr: batches stay where the loader makes them
  torch::Device device_;
};

namespace detail {
// Note [Collections of tensors]
// Lightning's collectives take nested lists, tuples and dicts of tensors
// (apply_to_collection); here std::vector, std::array, std::map,
// std::unordered_map, std::pair and std::tuple of tensors, nested in any
// way, each tensor its own collective in the collection's order.
template <typename T>
struct is_tensor_collection : std::false_type {};
template <typename T>
inline constexpr bool is_tensor_leaf = std::is_same_v<T, torch::Tensor> || is_tensor_collection<T>::value;
template <typename T, typename A>
struct is_tensor_collection<std::vector<T, A>> : std::bool_constant<is_tensor_leaf<T>> {};
template <typename T, size_t N>
struct is_tensor_collection<std::array<T, N>> : std::bool_constant<is_tensor_leaf<T>> {};
template <typename K, typename T, typename C, typename A>
struct is_tensor_collection<std::map<K, T, C, A>> : std::bool_constant<is_tensor_leaf<T>> {};
template <typename K, typename T, typename H, typename E, typename A>
struct is_tensor_collection<std::unordered_map<K, T, H, E, A>> : std::bool_constant<is_tensor_leaf<T>> {};
template <typename A, typename B>
struct is_tensor_collection<std::pair<A, B>> : std::bool_constant<is_tensor_leaf<A> && is_tensor_leaf<B>> {};
template <typename... T>
struct is_tensor_collection<std::tuple<T...>> : std::bool_constant<(is_tensor_leaf<T> && ...)> {};

// Declared first, so that each finds the others for nested collections.
template <typename F>
void for_each_tensor(torch::Tensor& tensor, F& f);
template <typename T, typename A, typename F>
void for_each_tensor(std::vector<T, A>& items, F& f);
template <typename T, size_t N, typename F>
void for_each_tensor(std::array<T, N>& items, F& f);
template <typename K, typename T, typename C, typename A, typename F>
void for_each_tensor(std::map<K, T, C, A>& items, F& f);
template <typename K, typename T, typename H, typename E, typename A, typename F>
void for_each_tensor(std::unordered_map<K, T, H, E, A>& items, F& f);
template <typename A, typename B, typename F>
void for_each_tensor(std::pair<A, B>& items, F& f);
template <typename... T, typename F>
void for_each_tensor(std::tuple<T...>& items, F& f);

template <typename F>
void for_each_tensor(torch::Tensor& tensor, F& f) {
  f(tensor);
}
template <typename T, typename A, typename F>
void for_each_tensor(std::vector<T, A>& items, F& f) {
  for (auto& item : items) for_each_tensor(item, f);
}
template <typename T, size_t N, typename F>
void for_each_tensor(std::array<T, N>& items, F& f) {
  for (auto& item : items) for_each_tensor(item, f);
}
template <typename K, typename T, typename C, typename A, typename F>
void for_each_tensor(std::map<K, T, C, A>& items, F& f) {
  for (auto& item : items) for_each_tensor(item.second, f);
}
template <typename K, typename T, typename H, typename E, typename A, typename F>
void for_each_tensor(std::unordered_map<K, T, H, E, A>& items, F& f) {
  for (auto& item : items) for_each_tensor(item.second, f);
}
template <typename A, typename B, typename F>
void for_each_tensor(std::pair<A, B>& items, F& f) {
  for_each_tensor(items.first, f);
  for_each_tensor(items.second, f);
}
template <typename... T, typename F>
void for_each_tensor(std::tuple<T...>& items, F& f) {
  std::apply([&](auto&... item) { (for_each_tensor(item, f), ...); }, items);
}
}  // namespace detail

/// While it lives, tensors are made in the dtype of a "-true" precision other
/// than 32 (Lightning's init_module and init_tensor contexts); a no-op for the
/// others. Restores the default dtype when it ends.
class [[nodiscard]] DefaultDtypeGuard {
 public:
  FULGOR_API explicit DefaultDtypeGuard(const Precision& precision);
  FULGOR_API ~DefaultDtypeGuard();
  DefaultDtypeGuard(const DefaultDtypeGuard&) = delete;
  DefaultDtypeGuard& operator=(const DefaultDtypeGuard&) = delete;

 private:
  std::optional<caffe2::TypeMeta> previous_;
};

/// How Fabric::setup_dataloaders prepares a loader (Lightning's arguments).
struct DataLoaderSetup {
  /// Make the loader read only this rank's shard (through its distribute()
  /// member, Note [The loader protocol]), padded so that every rank gets the
  /// same number of batches; a loader without one, or with a sampler of the
  /// user's, is read as it is.
  bool use_distributed_sampler = true;
  /// Move each batch onto the Fabric's device (skipped when the loader makes
  /// them there already).
  bool move_to_device = true;
};

/// How Fabric::clip_gradients clips: by value or by norm, one of the two.
struct ClipGradients {
  std::optional<double> clip_val = std::nullopt;  ///< each gradient element into [-clip_val, clip_val]
  std::optional<double> max_norm = std::nullopt;  ///< the gradients' total norm at most max_norm
  double norm_type = 2.0;
  /// Throw when the total norm is NaN or infinite (Lightning's default).
  bool error_if_nonfinite = true;
};

/// Turns a module's gradient synchronization (or, under sharding, its
/// reduction) off for its lifetime (see Fabric::no_backward_sync).
class [[nodiscard]] BackwardSyncGuard {
 public:
  FULGOR_API ~BackwardSyncGuard();
  BackwardSyncGuard(const BackwardSyncGuard&) = delete;
  BackwardSyncGuard& operator=(const BackwardSyncGuard&) = delete;

 private:
  // Made by Fabric::no_backward_sync alone, inside the library: not
  // exported (Note [Exported symbols]).
  friend class Fabric;
  BackwardSyncGuard(detail::FabricModule* module, bool enabled);

  detail::FabricModule* module_;
  bool previous_ = true;
};

/// Lightning Fabric for a training loop of one's own: the accelerator, the
/// devices and their processes, the precision, data-parallel training and
/// checkpoints of the Trainer, called from a loop the program keeps.
///
///   fulgor::Fabric fabric({.accelerator = "cpu", .devices = 2});
///   fabric.launch();
///   auto optimizer = fabric.setup(*model, sgd);
///   auto loader = fabric.setup_dataloaders(fulgor::TensorLoader(x, y));
///   for (auto& batch : loader) {
///     optimizer.zero_grad();
///     torch::Tensor loss = torch::mse_loss(model->forward(batch.data), batch.target);
///     fabric.backward(loss);
///     optimizer.step();
///   }
///
/// Contract (Lightning 2.6's lightning/fabric/fabric.py; docs/ways_in.md lists
/// where fulgor differs):
///   - The constructor resolves the accelerator, devices, precision and
///     strategy (ConfigError or DeviceError naming a value that is not
///     accepted) and touches no device.
///   - launch() joins the job: with strategy "auto", "ddp" or "fsdp" and devices
///     selecting N > 1 devices in a process no launcher started, it runs the
///     program again as ranks 1..N-1 (the Trainer's launcher, Note [The
///     Trainer's own launcher]) and this process goes on as rank 0; under a
///     launcher (torchrun, fulgor-run, srun) it joins the launcher's job. It
///     sets up the device. On one device it is optional; with more, every
///     other member but the constructor, seed_everything and the properties
///     throws Error until it is called. Call it once (Error otherwise).
///   - Collectives (setup under ddp, backward of a synchronized step,
///     all_reduce, all_gather, broadcast, barrier, save, load, and under
///     sharding the optimizers' steps and clipping by norm) are called by
///     every rank in the same order.
///   - Under sharding (strategy "fsdp" with sharding_strategy
///     "SHARD_GRAD_OP", or zero_redundancy_optimizer; Note [Parameter
///     shards]) every rank keeps whole parameters, and a set-up optimizer
///     steps this rank's pieces of them in their place: set the module up
///     before its optimizer (setup(module, optimizer) does), step through
///     FabricOptimizer::step or step(optimizer), which gather the pieces
///     into the parameters, and read the gradients from the optimizer's
///     parameters: backward frees the module's. A step of the bare
///     optimizer (optimizer->step()) is found at the next synchronized
///     backward or step, which throws Error naming fabric.step.
///   - The modules and optimizers given to setup must outlive the Fabric.
class FULGOR_API Fabric {
 public:
  explicit Fabric(FabricOptions options = {});
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  /// Starts or joins the job's processes and sets up this process's device.
  void launch();
  /// Lightning's launch(function): launch(), then `function(*this)`, whose
  /// result it returns.
  template <typename F>
  auto launch(F&& function) -> decltype(std::forward<F>(function)(std::declval<Fabric&>())) {
    launch();
    return std::forward<F>(function)(*this);
  }

  // ---- Models, optimizers, loaders -------------------------------------------
  /// Lightning's setup: converts the module for a "-true" precision, moves
  /// it onto the device (its tensors in place, so optimizers built on them
  /// stay valid) and, under ddp, synchronizes its gradients over the ranks
  /// (rank 0's parameters and buffers are copied to every rank now). Under
  /// sharding it cuts the module's parameters into the ranks' pieces, and
  /// the optimizers then step this rank's pieces. Returns the optimizers as
  /// FabricOptimizers: one, a tuple of several, or nothing. A module or
  /// optimizer set up twice throws ConfigError; so does, under sharding, an
  /// optimizer with a state already (set it up before load restores it), or
  /// one that steps trainable parameters of no set-up module.
  template <typename M, typename... Optimizers>
  auto setup(M& module, Optimizers&... optimizers) {
    setup_module(as_module(module));
    return setup_optimizers(optimizers...);
  }
  /// setup's first half; `move_to_device` false leaves the module where it
  /// is (Lightning's setup(..., move_to_device=False)).
  void setup_module(torch::nn::Module& module, bool move_to_device = true);
  /// setup's second half (Lightning's setup_optimizers).
  template <typename... Optimizers>
  auto setup_optimizers(Optimizers&... optimizers) {
    if constexpr (sizeof...(Optimizers) == 1) {
      return wrap_optimizer(as_optimizer(optimizers)...);
    } else if constexpr (sizeof...(Optimizers) > 1) {
      return std::make_tuple(wrap_optimizer(as_optimizer(optimizers))...);
    }
  }

  /// While the guard lives, modules and tensors are made in the dtype of a
  /// "-true" precision (Lightning's init_module and init_tensor; see
  /// DefaultDtypeGuard). LibTorch has no default device: setup moves the
  /// module onto the device.
  DefaultDtypeGuard init_module() const { return DefaultDtypeGuard(precision()); }
  DefaultDtypeGuard init_tensor() const { return DefaultDtypeGuard(precision()); }

  /// This rank's shard of `loader`, its batches on the device (see
  /// DataLoaderSetup). The loader is moved into the result.
  template <typename Loader>
  FabricDataLoader<Loader> setup_dataloaders(Loader loader, DataLoaderSetup setup = {}) {
    using Held = detail::LoaderOf<Loader>;
    static_assert(detail::is_iterable<Held>::value,
                  "Fabric::setup_dataloaders takes a loader with begin() and end() that yields batches: a fulgor "
                  "loader, torch::data::make_data_loader's result, or a range of batches");
    require_launched("setup_dataloaders");
    if constexpr (detail::has_distribute<Held>::value) {
      if (setup.use_distributed_sampler) detail::held_loader(loader).distribute(shard());
    }
    return FabricDataLoader<Loader>(std::move(loader), setup.move_to_device ? accelerator_.get() : nullptr, device());
  }

  /// Moves a tensor or a batch (anything fulgor::move_batch moves) onto the
  /// device; a module is moved in place, as setup moves it.
  template <typename T>
  T to_device(T batch) const {
    return move_batch(std::move(batch), *accelerator_, device());
  }
  void to_device(torch::nn::Module& module) const;

  // ---- The training step ------------------------------------------------------
  /// Replaces loss.backward(): scales the loss under "16-mixed" and, under
  /// ddp, waits until the set-up modules' gradients are averaged over the
  /// ranks (unless a no_backward_sync guard is alive); under sharding, the
  /// averages are added to the optimizers' pieces' gradients, and the
  /// modules' own are freed. Under a mixed precision, warns once when no
  /// autocast() scope was opened since the last backward (the forward pass
  /// then ran in float32).
  void backward(const torch::Tensor& loss);
  /// Clips the gradients of `module`'s parameters (unscaling `optimizer`'s
  /// first under "16-mixed"); returns the total norm when clipping by norm.
  /// Under sharding, clips `optimizer`'s pieces of them, by their 2-norm over
  /// the ranks (a collective). Throws ConfigError unless exactly one of
  /// clip_val and max_norm is set, and for a norm_type other than 2 under
  /// sharding.
  std::optional<double> clip_gradients(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                       const ClipGradients& how);
  std::optional<double> clip_gradients(torch::nn::Module& module, FabricOptimizer& optimizer,
                                       const ClipGradients& how) {
    return clip_gradients(module, optimizer.optimizer(), how);
  }
  /// Autocast for the precision (nothing unless it is mixed), for code
  /// beyond the forward pass; `auto autocast = fabric.autocast();`.
  AutocastScope autocast() const {
    autocast_since_backward_ = true;
    return AutocastScope(precision(), *accelerator_);
  }
  /// While the guard lives, backward accumulates `module`'s gradients
  /// locally without communicating (gradient accumulation); `enabled` false
  /// makes it a no-op. A no-op on one process. Throws ConfigError for a
  /// module setup has not seen.
  BackwardSyncGuard no_backward_sync(torch::nn::Module& module, bool enabled = true);
  /// Runs `body` with the set-up `module`'s parameters whole: under
  /// FULL_SHARD a collective that gathers its units' parameters, and cuts
  /// what `body` changed in them back into the ranks' pieces (FSDP's
  /// summon_full_params); elsewhere it runs `body`. Throws ConfigError for a
  /// module setup has not seen.
  void with_whole_parameters(torch::nn::Module& module, const std::function<void()>& body);
  /// The FabricOptimizer's step (see there); under sharding, then gathers
  /// the pieces it stepped into the modules' parameters (a collective).
  bool step(torch::optim::Optimizer& optimizer);

  // ---- Collectives ------------------------------------------------------------
  // Each takes the group to communicate in, a group of new_group() that this
  // rank belongs to; nullptr: the whole job.
  /// `tensor` combined over the ranks (Lightning's default: the mean), in
  /// place on the device; returned for convenience. One process: unchanged.
  torch::Tensor all_reduce(torch::Tensor tensor, ReduceOp op = ReduceOp::mean, ProcessGroup* group = nullptr);
  double all_reduce(double value, ReduceOp op = ReduceOp::mean, ProcessGroup* group = nullptr);
  /// The ranks' tensors stacked along a new first dimension; one process:
  /// the tensor itself, as Lightning's.
  torch::Tensor all_gather(const torch::Tensor& tensor, ProcessGroup* group = nullptr);
  /// Rank `src`'s tensor, on every rank.
  torch::Tensor broadcast(torch::Tensor tensor, int64_t src = 0, ProcessGroup* group = nullptr);
  /// Rank `src`'s JSON value (any plain object), on every rank.
  nlohmann::json broadcast(const nlohmann::json& value, int64_t src = 0);
  void barrier(ProcessGroup* group = nullptr);
  /// The same over every tensor of a collection (Note [Collections of
  /// tensors]), which comes back with the results in its place.
  template <typename C, typename = std::enable_if_t<detail::is_tensor_collection<C>::value>>
  C all_reduce(C data, ReduceOp op = ReduceOp::mean, ProcessGroup* group = nullptr) {
    auto reduce = [&](torch::Tensor& t) { t = all_reduce(t, op, group); };
    detail::for_each_tensor(data, reduce);
    return data;
  }
  template <typename C, typename = std::enable_if_t<detail::is_tensor_collection<C>::value>>
  C all_gather(C data, ProcessGroup* group = nullptr) {
    auto gather = [&](torch::Tensor& t) { t = all_gather(t, group); };
    detail::for_each_tensor(data, gather);
    return data;
  }
  template <typename C, typename = std::enable_if_t<detail::is_tensor_collection<C>::value>>
  C broadcast(C data, int64_t src = 0, ProcessGroup* group = nullptr) {
    auto from_src = [&](torch::Tensor& t) { t = broadcast(t, src, group); };
    detail::for_each_tensor(data, from_src);
    return data;
  }
  /// A group of the ranks `ranks` of the job (distinct, ascending), as
  /// torch.distributed.new_group, for the collectives' `group`: every rank
  /// calls it, in the same order; the members get the group, the others
  /// nullopt. One process: ranks must be {0}, and the group is nullopt.
  std::optional<ProcessGroup> new_group(const std::vector<int64_t>& ranks);
  /// Lightning's rank_zero_first: rank 0 (each node's local rank 0 where
  /// `local`) runs `function` first and the other ranks once it has finished
  /// (to download a data set once, say). A collective.
  template <typename F>
  void rank_zero_first(F&& function, bool local = false) {
    const bool first = (local ? local_rank() : global_rank()) == 0;
    if (!first) barrier();
    std::forward<F>(function)();
    if (first) barrier();
  }

  // ---- Callbacks ----------------------------------------------------------------
  /// Lightning's call: runs the hook `name` of every callback that has one
  /// (FabricCallback), in the callbacks' order, with `args`.
  template <typename... Args>
  void call(const std::string& name, const Args&... args) {
    for (const auto& callback : callbacks_) callback->call(name, args...);
  }
  const std::vector<std::shared_ptr<FabricCallback>>& callbacks() const { return callbacks_; }

  // ---- Checkpoints --------------------------------------------------------------
  /// Writes `state` to `path` in fulgor's checkpoint format (one file,
  /// written atomically by rank 0; every rank waits for it). Never code: no
  /// TorchScript or pickled objects, only tensors and JSON. Under sharding,
  /// an optimizer's state is saved whole, gathered from the ranks' pieces,
  /// so that any number of ranks can load it. With state_dict_type
  /// "sharded", a distributed checkpoint's folder instead, which every rank
  /// writes its pieces into, nothing gathered (Note [Sharded training
  /// checkpoints]); a name may not be "fulgor" then.
  void save(const std::string& path, const FabricState& state);
  /// Restores `state` in place from `path`: a file or folder written by
  /// save, or a torch.save / Lightning file of a dict (read by fulgor's interop
  /// readers, which run nothing): a module from a state dict, an optimizer
  /// from a torch.optim state dict, values from numbers, bools and strings.
  /// With `strict`, every name of `state` must be in the file and modules
  /// must match exactly (CheckpointError naming the name and file). Returns
  /// the file's plain values that `state` did not ask for.
  nlohmann::json load(const std::string& path, const FabricState& state, bool strict = true);
  /// Loads weights into one module from a file of any format read_weights
  /// reads (torch.save state dicts, Lightning .ckpt, fulgor checkpoints,
  /// safetensors), matched strictly or not (Lightning's load_raw).
  void load_raw(const std::string& path, torch::nn::Module& module, bool strict = true);
  /// Loads a torch.optim state dict from a torch.save / Lightning file.
  void load_raw(const std::string& path, torch::optim::Optimizer& optimizer);

  // ---- Output -------------------------------------------------------------------
  /// Prints the arguments separated by spaces on each node's local rank 0.
  template <typename... Args>
  void print(const Args&... args) const {
    if (local_rank() != 0) return;
    std::ostringstream line;
    const char* separator = "";
    ((line << separator << args, separator = " "), ...);
    std::cout << line.str() << std::endl;
  }
  /// Sends a metric to the loggers (rank 0's only). Without a step, the
  /// number of log calls so far.
  void log(const std::string& name, double value, std::optional<int64_t> step = std::nullopt);
  void log(const std::string& name, const torch::Tensor& value, std::optional<int64_t> step = std::nullopt);
  void log_dict(const std::map<std::string, double>& metrics, std::optional<int64_t> step = std::nullopt);
  const std::vector<std::shared_ptr<Logger>>& loggers() const { return loggers_; }

  /// fulgor::seed_everything.
  static uint64_t seed_everything(uint64_t seed);

  // ---- Where this process stands ----------------------------------------------
  int64_t global_rank() const { return environment_.rank; }
  int64_t local_rank() const { return environment_.local_rank; }
  int64_t node_rank() const { return environment_.node_rank; }
  int64_t world_size() const { return environment_.world_size; }
  bool is_global_zero() const { return environment_.rank == 0; }
  torch::Device device() const { return device_setup_.device; }
  const Accelerator& accelerator() const { return *accelerator_; }
  const Precision& precision() const;
  /// "ddp", "fsdp" or "single_device", what "auto" became.
  const std::string& strategy() const { return strategy_; }
  /// The "16-mixed" loss scaler; nullptr otherwise.
  GradScaler* grad_scaler() const;

 private:
  template <typename M>
  static torch::nn::Module& as_module(M& module) {
    if constexpr (std::is_base_of_v<torch::nn::Module, M>) {
      return module;
    } else {
      return *module;  // a ModuleHolder or a shared_ptr
    }
  }
  template <typename O>
  static torch::optim::Optimizer& as_optimizer(O& optimizer) {
    if constexpr (std::is_base_of_v<torch::optim::Optimizer, O>) {
      return optimizer;
    } else {
      return *optimizer;
    }
  }
  void require_launched(const char* what) const;
  FabricOptimizer wrap_optimizer(torch::optim::Optimizer& optimizer);
  ProcessGroup* communicator(ProcessGroup* group);
  DistributedShard shard() const;
  detail::FabricModule* set_up(const torch::nn::Module& module, const char* what) const;
  void check_reduced(torch::optim::Optimizer& optimizer) const;
  void with_whole_states(const FabricState& state, bool load, const std::function<void()>& body);

  void warn_once(const std::string& message);

  FabricOptions options_;
  std::unique_ptr<Accelerator> accelerator_;
  std::unique_ptr<detail::PrecisionPlugin> precision_;  // shared with the Trainer
  std::string strategy_;
  std::vector<torch::Device> selected_;
  DistributedEnvironment environment_;
  DeviceSetup device_setup_;
  bool launched_ = false;
  std::unique_ptr<ProcessGroup> group_;
  std::vector<std::shared_ptr<Logger>> loggers_;
  std::vector<std::shared_ptr<FabricCallback>> callbacks_;
  int64_t log_calls_ = 0;
  std::vector<std::unique_ptr<detail::FabricModule>> modules_;
  std::vector<torch::optim::Optimizer*> optimizers_;
  mutable bool autocast_since_backward_ = false;
  std::set<std::string> warned_;
};

inline bool FabricOptimizer::step() { return fabric_->step(*optimizer_); }

}  // namespace fulgor
