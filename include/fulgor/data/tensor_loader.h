#pragma once

#include <torch/data/example.h>
#include <torch/data/samplers/base.h>
#include <torch/types.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/data/loader_protocol.h"

namespace fulgor {

struct TensorLoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = false;
  /// Drop the last batch when it would be smaller than batch_size.
  bool drop_last = false;
  /// Shuffling draws epoch e's order from a generator seeded with seed + e, so
  /// the order of any epoch can be reproduced (on resume, on every rank).
  uint64_t seed = 0;
  /// Make every batch in pinned (page-locked) host memory, as PyTorch's
  /// DataLoader(pin_memory=True) does, so that copying it to an accelerator
  /// that supports pinned memory can be asynchronous: a shuffled or sampled
  /// batch is gathered straight into pinned memory, an in-order one is copied
  /// there (or is a view, where the data set is pinned already). Needs a
  /// LibTorch that can pin host memory (one with CUDA).
  bool pin_memory = false;
};

/// Batches from a data set held in memory as whole tensors: data [N, ...] and
/// targets [N, ...]. A batch is a slice (in order) or one index_select per
/// tensor (shuffled or sampled), never N small tensors stacked, which is what
/// makes it several times faster than torch::data::make_data_loader with
/// Stack<> on small models.
///
/// Iterate it like a LibTorch data loader: `for (torch::data::Example<>& batch : loader)`.
/// Each iteration is one epoch; the next one uses the following epoch's order
/// unless set_epoch() chose another.
///
/// distribute() makes it read one rank's shard (the Trainer does this under
/// ddp): a fulgor::DistributedSampler with the loader's shuffle and seed, so
/// that epoch e's order is still drawn from seed + e, the same on every rank,
/// and the ranks' shards of it are disjoint.
///
/// Requires: data and targets share their first dimension; batch_size >= 1.
/// Not thread-safe: one iteration at a time.
class FULGOR_API TensorLoader {
 public:
  using Batch = torch::data::Example<>;

  TensorLoader(torch::Tensor data, torch::Tensor targets, TensorLoaderOptions options = {});
  /// Takes batch indices from `sampler` instead (for example a distributed
  /// sampler giving each rank its shard); options.shuffle must then be false.
  /// A sampler whose order depends on the epoch (a fulgor::EpochSampler, such
  /// as fulgor::DistributedSampler, or LibTorch's DistributedSampler<>) is set
  /// to the loader's epoch as each iteration begins.
  TensorLoader(torch::Tensor data, torch::Tensor targets, std::unique_ptr<torch::data::samplers::Sampler<>> sampler,
               TensorLoaderOptions options = {});

  /// Batches per epoch.
  int64_t size() const;
  /// Samples in the data set.
  int64_t dataset_size() const { return data_.size(0); }
  const TensorLoaderOptions& options() const { return options_; }
  /// Turns shuffling off from the next iteration on; returns whether it was
  /// on. The Trainer's overfit_batches does this, as Lightning does.
  bool disable_shuffle();

  /// Reads only `shard` of the data set from the next iteration on (through a
  /// DistributedSampler with options.shuffle and options.seed, split evenly or
  /// not as `shard` says); num_replicas 1 reads the whole data set again.
  /// size() then counts the shard's batches. Returns false, changing nothing,
  /// for a loader built with a sampler of the user's.
  bool distribute(const DistributedShard& shard);

  /// Whether every batch is on `device` as made (the data and targets are
  /// there), so that a Trainer need not move it.
  bool batches_on(torch::Device device) const { return data_.device() == device && targets_.device() == device; }

  /// The data set's indices of the samples in the batch made last (empty
  /// before the first).
  std::vector<int64_t> batch_indices() const;

  /// The epoch the next iteration plays (its shuffle order).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  /// From the next batch on, makes batches in pinned memory (options.pin_memory).
  /// A DevicePrefetcher calls it where its accelerator supports pinned memory.
  void pin_memory();

  class FULGOR_API Iterator : public detail::BatchIterator<Iterator, Batch> {
   public:
    Batch& operator*() { return batch_; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return done_ == other.done_; }

   private:
    friend class TensorLoader;
    Iterator() = default;
    explicit Iterator(TensorLoader* loader);
    TensorLoader* loader_ = nullptr;
    int64_t position_ = 0;
    Batch batch_;
    bool done_ = true;
  };

  /// Starts an epoch.
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  // Fills `batch` with the next batch of the current epoch; false at its end.
  bool next_batch(int64_t& position, Batch& batch);

  torch::Tensor data_;
  torch::Tensor targets_;
  std::unique_ptr<torch::data::samplers::Sampler<>> sampler_;
  bool user_sampler_ = false;
  // The shard distribute() chose, which sampler_ reads; unset: no shard.
  std::optional<DistributedShard> shard_;
  TensorLoaderOptions options_;
  int64_t epoch_ = 0;
  torch::Tensor order_;  // this epoch's permutation when shuffling
  // The last batch's rows: `last_index_` when picked, else the `last_count_`
  // rows from `last_start_` (batch_indices() builds the list when asked, off
  // the per-step path).
  torch::Tensor last_index_;
  int64_t last_start_ = 0, last_count_ = 0;
};

}  // namespace fulgor
