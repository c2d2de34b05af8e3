#pragma once

#include <torch/data/example.h>

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgor/data/loader_protocol.h"

namespace fulgor {

class Accelerator;

namespace detail {
template <typename T>
struct is_pointer_like : std::false_type {};
template <typename T, typename D>
struct is_pointer_like<std::unique_ptr<T, D>> : std::true_type {};
template <typename T>
struct is_pointer_like<std::shared_ptr<T>> : std::true_type {};
template <typename T>
struct is_reference_wrapper : std::false_type {};
template <typename T>
struct is_reference_wrapper<std::reference_wrapper<T>> : std::true_type {};

// The loader an AnyLoader holds, through its pointer or reference wrapper.
template <typename Holder>
auto& held_loader(Holder& holder) {
  if constexpr (is_pointer_like<std::remove_const_t<Holder>>::value)
    return *holder;
  else if constexpr (is_reference_wrapper<std::remove_const_t<Holder>>::value)
    return holder.get();
  else
    return holder;
}

// Note [One erased loader]
// The loader protocol (Note [The loader protocol]) behind one interface,
// whatever the batch type. AnyLoader's Model answers each member with its
// loader's where the loader has it, in that one place; the Trainer's step
// runner runs every loader through an AnyLoader (a loader given as an
// AnyLoader as it is), and asks the protocol of this base, without knowing
// the batch type.
class ErasedLoader {
 public:
  virtual ~ErasedLoader() = default;
  virtual std::optional<int64_t> length() const = 0;
  virtual void set_epoch(int64_t epoch) = 0;
  virtual bool disable_shuffle() = 0;
  virtual bool batches_on(torch::Device device) const = 0;
  virtual void bind_device(const Accelerator& accelerator, torch::Device device) = 0;
  virtual void pin_memory() = 0;
  virtual bool distribute(const DistributedShard& shard) = 0;
  virtual bool start_at(int64_t batch) = 0;
  virtual std::optional<std::vector<int64_t>> batch_indices() const = 0;
};

// What an AnyLoader is without its batch type: the protocol's members.
class AnyLoaderBase {
 public:
  /// Whether it holds no loader.
  bool empty() const { return loader_ == nullptr; }
  explicit operator bool() const { return !empty(); }

  /// Batches per epoch, when the loader tells (an empty AnyLoader: nullopt).
  std::optional<int64_t> length() const { return loader_ ? loader_->length() : std::nullopt; }
  void set_epoch(int64_t epoch) { loader_->set_epoch(epoch); }
  bool disable_shuffle() { return loader_->disable_shuffle(); }
  bool batches_on(torch::Device device) const { return loader_->batches_on(device); }
  void bind_device(const Accelerator& accelerator, torch::Device device) { loader_->bind_device(accelerator, device); }
  void pin_memory() { loader_->pin_memory(); }
  bool distribute(const DistributedShard& shard) { return loader_->distribute(shard); }
  bool start_at(int64_t batch) { return loader_->start_at(batch); }
  /// The held loader's batch_indices(), where it offers them.
  std::optional<std::vector<int64_t>> batch_indices() const { return loader_->batch_indices(); }

 protected:
  AnyLoaderBase() = default;
  explicit AnyLoaderBase(std::unique_ptr<ErasedLoader> loader) : loader_(std::move(loader)) {}

  std::unique_ptr<ErasedLoader> loader_;
};
}  // namespace detail

/// Any loader of `Batch`es, owned, behind one type: what a DataModule's
/// train_loader() and the others return, so that they can be virtual.
///
///   fulgor::AnyLoader<> train_loader() override { return fulgor::TensorLoader(x, y, {.batch_size = 64}); }
///
/// Holds the loader by value (or the std::unique_ptr / std::shared_ptr that
/// LibTorch's make_data_loader returns, or a std::reference_wrapper to a
/// loader the data module keeps: `return std::ref(val_);`) and iterates it
/// like the loader itself. It offers every member of the loader protocol (Note [The loader
/// protocol]) and passes each on where the loader has it: size() becomes
/// length(), nullopt when the loader does not tell. A default-constructed
/// AnyLoader holds nothing (empty()): a DataModule's "no such loader".
///
/// Requires: the loader's batches convert to Batch. Not thread-safe: one
/// iteration at a time.
template <typename Batch = torch::data::Example<>>
class AnyLoader : public detail::AnyLoaderBase {
  struct Concept : detail::ErasedLoader {
    // Begins an epoch, or goes to the next batch; false when there is none.
    virtual bool start() = 0;
    virtual bool advance() = 0;
    virtual Batch& current() = 0;
  };

  template <typename Holder>
  class Model final : public Concept {
    using Loader = std::remove_reference_t<decltype(detail::held_loader(std::declval<Holder&>()))>;
    using Iterator = decltype(std::declval<Loader&>().begin());
    static_assert(std::is_constructible_v<Batch, std::decay_t<decltype(*std::declval<Iterator&>())>&&>,
                  "the loader's batches do not convert to the module's batch type: derive the module from "
                  "fulgor::BasicModule<B> with B the type the loader yields");

   public:
    explicit Model(Holder holder) : holder_(std::move(holder)) {}

    bool start() override {
      batch_.reset();
      it_.reset();
      end_.reset();
      it_.emplace(loader().begin());
      end_.emplace(loader().end());
      return fill();
    }
    bool advance() override {
      ++*it_;
      return fill();
    }
    Batch& current() override { return *batch_; }
    std::optional<int64_t> length() const override { return loader_length(loader()); }
    void set_epoch(int64_t epoch) override {
      if constexpr (detail::has_set_epoch<Loader>::value) loader().set_epoch(epoch);
    }
    bool disable_shuffle() override {
      if constexpr (detail::has_disable_shuffle<Loader>::value) return loader().disable_shuffle();
      return false;
    }
    bool batches_on(torch::Device device) const override {
      if constexpr (detail::has_batches_on<Loader>::value) return loader().batches_on(device);
      return false;
    }
    void bind_device(const Accelerator& accelerator, torch::Device device) override {
      if constexpr (detail::has_bind_device<Loader>::value) loader().bind_device(accelerator, device);
    }
    void pin_memory() override {
      if constexpr (detail::has_pin_memory<Loader>::value) loader().pin_memory();
    }
    bool distribute(const DistributedShard& shard) override {
      if constexpr (detail::has_distribute<Loader>::value) return loader().distribute(shard);
      return false;
    }
    bool start_at(int64_t batch) override {
      if constexpr (detail::has_start_at<Loader>::value) return loader().start_at(batch);
      return false;
    }
    std::optional<std::vector<int64_t>> batch_indices() const override {
      if constexpr (detail::has_batch_indices<Loader>::value) return loader().batch_indices();
      return std::nullopt;
    }

   private:
    Loader& loader() { return detail::held_loader(holder_); }
    const Loader& loader() const { return detail::held_loader(holder_); }
    bool fill() {
      batch_.reset();
      if (*it_ == *end_) return false;
      batch_.emplace(Batch(std::move(**it_)));
      return true;
    }

    Holder holder_;
    std::optional<Iterator> it_, end_;
    std::optional<Batch> batch_;
  };

 public:
  using BatchType = Batch;

  AnyLoader() = default;
  template <typename L, typename = std::enable_if_t<!std::is_same_v<std::decay_t<L>, AnyLoader>>>
  AnyLoader(L&& loader)  // NOLINT(google-explicit-constructor): returned from train_loader() as is
      : AnyLoaderBase(std::make_unique<Model<std::decay_t<L>>>(std::forward<L>(loader))) {}

  class Iterator : public detail::BatchIterator<Iterator, Batch> {
   public:
    Batch& operator*() { return loader_->current(); }
    Iterator& operator++() {
      if (!loader_->advance()) loader_ = nullptr;
      return *this;
    }
    bool operator==(const Iterator& other) const { return loader_ == other.loader_; }

   private:
    friend class AnyLoader;
    Iterator() = default;
    explicit Iterator(Concept* loader) : loader_(loader->start() ? loader : nullptr) {}
    Concept* loader_ = nullptr;
  };

  /// Starts an epoch. Requires: !empty().
  Iterator begin() { return Iterator(static_cast<Concept*>(loader_.get())); }
  Iterator end() { return Iterator(); }
  // The protocol's members (length(), set_epoch(), ...): detail::AnyLoaderBase.
};

/// An AnyLoader's length, which it knows only when its loader tells.
template <typename Batch>
std::optional<int64_t> loader_length(const AnyLoader<Batch>& loader) {
  return loader.length();
}

}  // namespace fulgor
