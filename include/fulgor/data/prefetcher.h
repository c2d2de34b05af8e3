#pragma once

#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/batch.h"
#include "fulgor/core/error.h"
#include "fulgor/data/any_loader.h"
#include "fulgor/data/loader_protocol.h"

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
/// It passes every member of the loader protocol (Note [The loader
/// protocol]) on, where the loader has it: size(), set_epoch, disable_shuffle,
/// distribute, start_at, and batch_indices, which it answers for the batch it
/// handed out last rather than the one it fetched ahead. bind_device and
/// pin_memory are its own: it binds itself, and asks its loader for pinned
/// memory as iteration begins.
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
  template <typename L = Loader, typename = decltype(std::declval<L&>().disable_shuffle())>
  bool disable_shuffle() {
    return loader_->disable_shuffle();
  }
  template <typename L = Loader, typename = decltype(std::declval<L&>().distribute(DistributedShard{}))>
  bool distribute(const DistributedShard& shard) {
    return loader_->distribute(shard);
  }
  template <typename L = Loader, typename = decltype(std::declval<L&>().start_at(int64_t{}))>
  bool start_at(int64_t batch) {
    return loader_->start_at(batch);
  }
  /// The data set's indices of the batch handed out last.
  template <typename L = Loader, typename = decltype(std::declval<const L&>().batch_indices())>
  std::vector<int64_t> batch_indices() const {
    return indices_;
  }

  class Iterator : public detail::BatchIterator<Iterator, Batch> {
   public:
    Batch& operator*() { return *current_; }
    Iterator& operator++() {
      advance();
      return *this;
    }
    bool operator==(const Iterator& other) const { return current_.has_value() == other.current_.has_value(); }

   private:
    friend class DevicePrefetcher;
    Iterator() = default;
    explicit Iterator(DevicePrefetcher* owner) : owner_(owner), it_(owner->loader_->begin()) {
      fetch();
      advance();
    }
    // Hands out the batch fetched ahead, and fetches the next.
    void advance() {
      current_ = std::move(ahead_);
      ahead_.reset();
      owner_->indices_ = std::move(ahead_indices_);
      fetch();
    }
    // Issues the copy of the source's next batch, if any.
    void fetch() {
      if (!it_ || !(*it_ != owner_->loader_->end())) return;
      ahead_ = move_batch(Batch(**it_), *owner_->accelerator_, *owner_->device_,
                          owner_->accelerator_->supports_pinned_memory());
      if constexpr (detail::has_batch_indices<Loader>::value) ahead_indices_ = owner_->loader_->batch_indices();
      ++*it_;
    }

    DevicePrefetcher* owner_ = nullptr;
    std::optional<SourceIterator> it_;  // LibTorch's loader iterators have no default state
    std::optional<Batch> current_;
    std::optional<Batch> ahead_;
    std::vector<int64_t> ahead_indices_;
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
  std::vector<int64_t> indices_;  // of the batch handed out last
};

}  // namespace fulgor
