#pragma once

#include <torch/data/example.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/data/image_folder.h"
#include "fulgor/data/image_transforms.h"
#include "fulgor/data/loader_protocol.h"

namespace fulgor {

struct ImageLoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = false;
  /// Drop the last batch when it would be smaller than batch_size.
  bool drop_last = false;
  /// Epoch e's order is drawn from seed + e (a DistributedSampler's), and
  /// each sample's random transforms from (seed, epoch, index).
  uint64_t seed = 0;
  /// For a data set read as streams (plain tar shards, ImageDataset::
  /// streams()): samples held in the shuffle buffer (WebDataset's
  /// shuffle(n)). >= 1; 1 keeps the shards' order within each shard.
  int64_t shuffle_buffer = 1000;
  /// Threads decoding; 0 decodes on the iterating thread, as PyTorch's
  /// DataLoader(num_workers=0).
  int64_t num_workers = 2;
  /// Batches decoded ahead of the one handed out (memory: this many batches
  /// besides the one in use). >= 1.
  int64_t prefetch_batches = 2;
  /// Make batches in pinned host memory (a LibTorch with CUDA).
  bool pin_memory = false;
  /// true: a sample that cannot be read or decoded is left out of its batch,
  /// with a warning naming it, and counted (skipped()); false: the iteration
  /// throws its DataError when it reaches the batch.
  bool skip_corrupt = true;
  /// The most pixels an image may declare; a larger one is a DataError from
  /// its header alone (Note [Images from elsewhere] in image_decode.h).
  int64_t max_image_pixels = kDefaultMaxImagePixels;
  /// Where warnings go; unset: standard error.
  std::function<void(const std::string&)> warn;
};

/// Batches of images from an ImageDataset (an ImageFolder), decoded by
/// `num_workers` threads straight into their slots of a batch tensor made
/// once per batch: data [B, C, H, W] (the transforms' size and type),
/// target [B] (int64 class indices).
///
/// The epoch's order is a permutation drawn from (seed, epoch), or for a data
/// set read as streams its streams in an order drawn from (seed, epoch)
/// through a shuffle buffer (Note [Streamed shards]).
/// A batch is fixed by the epoch's order alone: batch k holds positions
/// [k B, (k + 1) B) of it, each sample transformed with its own random
/// choices (Note [Random choices by sample]), so batches do not depend on the
/// number of threads or on timing. Workers keep at most prefetch_batches
/// batches ahead.
///
/// Speaks the loader protocol (Note [The loader protocol]): size(),
/// set_epoch, distribute (a DistributedSampler's shards of each epoch's
/// order, even for training, unrepeated for evaluation), disable_shuffle and
/// pin_memory, and start_at, which lets a Trainer resumed mid-epoch go on at
/// the checkpoint's batch with exactly the batches the uninterrupted run had.
///
/// Requires: batch_size >= 1, prefetch_batches >= 1, num_workers >= 0,
/// shuffle_buffer >= 1 (ConfigError otherwise). One iteration at a time; starting another, or
/// destroying the loader, stops the workers of the one before.
class FULGOR_API ImageLoader {
 public:
  using Batch = torch::data::Example<>;

  ImageLoader(std::shared_ptr<const ImageDataset> dataset, ImageTransforms transforms, ImageLoaderOptions options = {});
  ~ImageLoader();
  ImageLoader(ImageLoader&&) noexcept;
  ImageLoader& operator=(ImageLoader&&) noexcept;

  /// Batches per epoch (of the shard, once distributed).
  int64_t size() const;
  /// Samples per epoch (of the shard).
  int64_t samples() const;
  const ImageDataset& dataset() const { return *dataset_; }
  const ImageLoaderOptions& options() const { return options_; }
  /// Samples skipped as corrupt, over the loader's life.
  int64_t skipped() const;

  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  bool distribute(const DistributedShard& shard);
  bool disable_shuffle();
  void pin_memory();
  /// The next iteration begins at batch `batch` of its epoch (its order and
  /// every sample's transforms as they would be), the ones before it unmade:
  /// how a Trainer resumes mid-epoch. Always true; ConfigError when negative.
  bool start_at(int64_t batch);

  class FULGOR_API Iterator : public detail::BatchIterator<Iterator, Batch> {
   public:
    Batch& operator*() { return batch_; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return done_ == other.done_; }

   private:
    friend class ImageLoader;
    Iterator() = default;
    explicit Iterator(ImageLoader* loader);
    ImageLoader* loader_ = nullptr;
    Batch batch_;
    bool done_ = true;
  };

  /// Starts an epoch: set_epoch's, or the one after the last begun.
  Iterator begin();
  Iterator end() { return Iterator(); }

  struct Run;  // one epoch's workers and batches (src/data/image_loader.cpp)

 private:
  std::vector<size_t> epoch_order(int64_t epoch) const;

  std::shared_ptr<const ImageDataset> dataset_;
  std::shared_ptr<const ImageTransforms> transforms_;
  ImageLoaderOptions options_;
  DistributedShard shard_;
  int64_t epoch_ = 0;
  int64_t start_batch_ = 0;
  std::shared_ptr<std::atomic<int64_t>> skipped_;
  std::unique_ptr<Run> run_;
};

}  // namespace fulgor
