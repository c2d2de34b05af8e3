#pragma once

// Note [The loader protocol]
// The Trainer takes any object with begin() and end() whose iterator yields
// the module's batch type: LibTorch's data loaders, fulgor::TensorLoader,
// fulgor::DevicePrefetcher, or a user's own. Beyond iteration a loader may
// offer any of these members, which the Trainer (or a DevicePrefetcher around
// the loader) calls where it finds them:
//
//   int64_t size() const          batches per epoch. Allows fractional
//                                 limit_*_batches and val_check_interval, and
//                                 ends an epoch at its known last batch.
//   void set_epoch(int64_t)       called before each training epoch with the
//                                 epoch's number, so that a loader shuffling by
//                                 epoch gives a resumed run the uninterrupted
//                                 run's order (Note [Loader epochs]).
//   bool disable_shuffle()        turns shuffling off for overfit_batches;
//                                 returns whether it was on.
//   bool batches_on(torch::Device) const
//                                 whether its batches are on that device
//                                 already, so that the Trainer does not move
//                                 them again.
//   void bind_device(const Accelerator&, torch::Device)
//                                 takes the Trainer's accelerator and device
//                                 as an epoch begins (a DevicePrefetcher built
//                                 without them).
//   void pin_memory()             makes its batches in pinned host memory; a
//                                 DevicePrefetcher asks for it where the
//                                 accelerator supports pinned memory.
//   bool distribute(const DistributedShard&)
//                                 reads only that shard of its data set from
//                                 the next epoch on (num_replicas 1: all of it
//                                 again); returns false when it cannot (its
//                                 sampler is the user's own). The Trainer
//                                 calls it as each loop starts (one replica
//                                 outside ddp), unless use_distributed_sampler
//                                 is false (Note [Distributed sampling] in
//                                 src/loops/context.cpp). size() reports the
//                                 shard's batches afterwards.
//   bool start_at(int64_t batch)  begins the next iteration at that batch of
//                                 its epoch, without making the ones before;
//                                 returns false when it cannot. A Trainer
//                                 resuming mid-epoch calls it after set_epoch,
//                                 where it would otherwise fetch and drop the
//                                 batches already trained on (Note [Resuming
//                                 mid-epoch] in src/loops/fit_loop.cpp).
//   std::vector<int64_t> batch_indices() const
//                                 the data set's indices of the samples in
//                                 the batch it yielded last (Lightning's
//                                 batch indices, which a prediction writer
//                                 records); a DevicePrefetcher, which runs
//                                 ahead, answers it for the batch it handed
//                                 out, not the one it fetched.
//
// fulgor::ImageLoader offers all but bind_device, batches_on and batch_indices;
// fulgor::TensorLoader offers all but bind_device and start_at; fulgor::make_data_loader's
// loaders offer size(), set_epoch and distribute; a DevicePrefetcher forwards
// what its loader offers. docs/training.md ("Loaders") says the same for users.
// The protocol is erased once, for any batch type, in AnyLoader (Note [One
// erased loader] in fulgor/data/any_loader.h), through which the Trainer
// runs every loader.

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace fulgor {

class Accelerator;

/// The part of a data set one rank of a data-parallel job reads.
struct DistributedShard {
  int64_t num_replicas = 1;  ///< 1: the whole data set
  int64_t rank = 0;
  /// true (training): every rank gets the same number of samples (padded by
  /// repeating samples from the start, as PyTorch's DistributedSampler with
  /// drop_last=false); false (evaluation, prediction): no sample repeated,
  /// shards differ by at most one sample.
  bool even = true;
};

namespace detail {

template <typename L, typename = void>
struct HasSize : std::false_type {};
template <typename L>
struct HasSize<L, std::void_t<decltype(std::declval<const L&>().size())>> : std::true_type {};

template <typename L, typename = void>
struct has_set_epoch : std::false_type {};
template <typename L>
struct has_set_epoch<L, std::void_t<decltype(std::declval<L&>().set_epoch(int64_t{}))>> : std::true_type {};

template <typename L, typename = void>
struct has_disable_shuffle : std::false_type {};
template <typename L>
struct has_disable_shuffle<L, std::void_t<decltype(std::declval<L&>().disable_shuffle())>> : std::true_type {};

template <typename L, typename = void>
struct has_batches_on : std::false_type {};
template <typename L>
struct has_batches_on<L, std::void_t<decltype(std::declval<const L&>().batches_on(std::declval<torch::Device>()))>>
    : std::true_type {};

template <typename L, typename = void>
struct has_bind_device : std::false_type {};
template <typename L>
struct has_bind_device<L, std::void_t<decltype(std::declval<L&>().bind_device(
                              std::declval<const Accelerator&>(), std::declval<torch::Device>()))>> : std::true_type {};

template <typename L, typename = void>
struct has_pin_memory : std::false_type {};
template <typename L>
struct has_pin_memory<L, std::void_t<decltype(std::declval<L&>().pin_memory())>> : std::true_type {};

template <typename L, typename = void>
struct has_distribute : std::false_type {};
template <typename L>
struct has_distribute<
    L, std::void_t<decltype(bool{std::declval<L&>().distribute(std::declval<const DistributedShard&>())})>>
    : std::true_type {};

template <typename L, typename = void>
struct has_batch_indices : std::false_type {};
template <typename L>
struct has_batch_indices<L, std::void_t<decltype(std::vector<int64_t>{std::declval<const L&>().batch_indices()})>>
    : std::true_type {};

template <typename L, typename = void>
struct has_start_at : std::false_type {};
template <typename L>
struct has_start_at<L, std::void_t<decltype(bool{std::declval<L&>().start_at(int64_t{})})>> : std::true_type {};

// Note [Batch iterators]
// The loaders' iterators are input iterators over batches, compared only
// with end(): what they have in common is written here once.
template <typename Derived, typename Batch>
class BatchIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;
  using pointer = Batch*;
  using reference = Batch&;

  Batch* operator->() { return &*static_cast<Derived&>(*this); }
  bool operator!=(const Derived& other) const { return !(static_cast<const Derived&>(*this) == other); }
};
}  // namespace detail

/// Batches per epoch of `loader` when it tells (a size() member), else nullopt.
template <typename Loader>
std::optional<int64_t> loader_length(const Loader& loader) {
  if constexpr (detail::HasSize<Loader>::value)
    return static_cast<int64_t>(loader.size());
  else
    return std::nullopt;
}

}  // namespace fulgor
