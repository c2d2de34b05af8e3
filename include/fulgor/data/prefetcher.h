#pragma once

#include <iterator>
#include <optional>
#include <utility>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/batch.h"
#include "fulgor/data/loader_protocol.h"
#include "fulgor/core/error.h"

namespace fulgor {

/// Iterates `loader` (anything with begin()/end(): a TensorLoader, a LibTorch
/// data loader) and hands out its batches already on `device`, keeping one
/// batch in flight: the copy of batch k+1 is issued before batch k is handed
/// out, so it proceeds while batch k is being computed on devices whose copies
/// are asynchronous. Where the accelerator supports pinned memory, copies are
/// non-blocking, and a loader that can make its batches in pinned memory
/// (a TensorLoader: pin_memory()) is asked to as iteration begins; other
/// loaders' batches are pinned one by one before their copy.
///
/// Given to a Trainer, a prefetcher made without an accelerator and device is
/// bound to the Trainer's when each epoch begins:
///
///   fulgor::DevicePrefetcher prefetched(train_loader);
///   trainer.fit(model, prefetched, val_loader);
///
/// It tells the Trainer the loader's length and passes set_epoch, distribute
/// and start_at on, where the loader has them.
///
/// Requires: loader, accelerator outlive the prefetcher; one iteration at a
/// time; an accelerator and device (given here or by a Trainer) before begin().
template <typename Loader>
class DevicePrefetcher {
  using SourceIterator = decltype(std::declval<Loader&>().begin());

 public:
  using Batch = std::decay_t<decltype(*std::declval<SourceIterator&>())>;

  DevicePrefetcher(Loader& loader, const Accelerator& accelerator, torch::Device device)
      : loader_(&loader), accelerator_(&accelerator), device_(device) {}
  /// Unbound: a Trainer binds it (bind_device) before iterating it.
  explicit DevicePrefetcher(Loader& loader) : loader_(&loader) {}

  void bind_device(const Accelerator& accelerator, torch::Device device) {
    accelerator_ = &accelerator;
    device_ = device;
  }

  template <typename L = Loader, typename = decltype(std::declval<const L&>().size())>
  auto size() const {
    return loader_->size();
  }
  template <typename L = Loader, typename = decltype(std::declval<L&>().set_epoch(int64_t{}))>
  void set_epoch(int64_t epoch) {
    loader_->set_epoch(epoch);
  }
  template <typename L = Loader, typename = decltype(std::declval<L&>().distribute(DistributedShard{}))>
  bool distribute(const DistributedShard& shard) {
    return loader_->distribute(shard);
  }
  template <typename L = Loader, typename = decltype(std::declval<L&>().start_at(int64_t{}))>
  bool start_at(int64_t batch) {
    return loader_->start_at(batch);
  }

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++() {
      current_ = std::move(ahead_);
      ahead_.reset();
      fetch();
      return *this;
    }
    bool operator==(const Iterator& other) const { return current_.has_value() == other.current_.has_value(); }
    bool operator!=(const Iterator& other) const { return !(*this == other); }

   private:
    friend class DevicePrefetcher;
    Iterator() = default;
    explicit Iterator(DevicePrefetcher* owner) : owner_(owner), it_(owner->loader_->begin()) {
      fetch();
      current_ = std::move(ahead_);
      ahead_.reset();
      fetch();
    }
    // Issues the copy of the source's next batch, if any.
    void fetch() {
      if (!it_ || !(*it_ != owner_->loader_->end())) return;
      ahead_ = move_batch(Batch(**it_), *owner_->accelerator_, *owner_->device_,
                          owner_->accelerator_->supports_pinned_memory());
      ++*it_;
    }

    DevicePrefetcher* owner_ = nullptr;
    std::optional<SourceIterator> it_;  // LibTorch's loader iterators have no default state
    std::optional<Batch> current_;
    std::optional<Batch> ahead_;
  };

  Iterator begin() {
    if (!accelerator_ || !device_)
      throw Error(
          "DevicePrefetcher: iterated without an accelerator and device; construct it with them, or give it to a "
          "Trainer, which binds its own");
    if constexpr (detail::has_pin_memory<Loader>::value)
      if (accelerator_->supports_pinned_memory()) loader_->pin_memory();
    return Iterator(this);
  }
  Iterator end() { return Iterator(); }

 private:
  Loader* loader_;
  const Accelerator* accelerator_ = nullptr;
  std::optional<torch::Device> device_;
};

}  // namespace fulgor
