#pragma once

#include <torch/serialize/archive.h>

#include <c10/util/Optional.h>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/data/epoch_sampler.h"

namespace fulgor {

/// How a DistributedSampler splits a data set.
struct DistributedSamplerOptions {
  /// Whether each epoch visits the data set in a new order (the same on every
  /// rank: drawn from seed + epoch).
  bool shuffle = true;
  uint64_t seed = 0;
  /// When the data set does not divide evenly over the ranks: true drops the
  /// last samples, false pads by repeating samples from the start, so that
  /// every rank gets the same number of samples (and runs the same number of
  /// steps, which the collectives of each step need). Only with even.
  bool drop_last = false;
  /// false: no sample is repeated or dropped, and the shards differ in size
  /// by at most one sample (Lightning's UnrepeatedDistributedSampler), which
  /// evaluation needs to count every sample once. Its ranks may run different
  /// numbers of batches, so no per-batch collective may depend on it.
  bool even = true;
};

/// How many samples rank `rank` of `num_replicas` reads of a data set of
/// `dataset_size` samples, split as DistributedSampler splits it.
FULGOR_API size_t shard_size(size_t dataset_size, int64_t num_replicas, int64_t rank, bool even = true,
                             bool drop_last = false);

/// Rank `rank`'s share of an epoch's `order`: positions rank, rank +
/// num_replicas, ... of it, padded first by repeating it from its start (even,
/// not drop_last) or cut (even, drop_last) to a multiple of num_replicas.
FULGOR_API std::vector<size_t> shard_of(std::vector<size_t> order, int64_t num_replicas, int64_t rank, bool even = true,
                                        bool drop_last = false);

/// The indices of one rank's shard of a data set, for LibTorch's data loaders.
///
/// Semantics of PyTorch's torch.utils.data.DistributedSampler: the epoch's
/// order (torch::randperm seeded with seed + epoch, or 0..n-1) is padded or
/// cut to a multiple of num_replicas, and rank r takes positions r,
/// r + num_replicas, r + 2 num_replicas, ... The shards of one epoch are
/// disjoint and, padded, cover the data set. With options.even false the
/// order is neither padded nor cut: the shards cover the data set exactly
/// once (the Trainer's evaluation shards, docs/training.md).
/// (LibTorch's DistributedRandomSampler has no seed of its own and assigns
/// contiguous ranges, so it is not used.)
///
/// Contract:
///   - set_epoch(e) before each epoch; the data loader calls reset() when an
///     epoch's iteration begins, which rebuilds the order for the current epoch.
///   - save() records the epoch and the position within it; after load(), the
///     next reset() keeps that position, so a loader resumed mid-epoch goes on
///     where the saved one stopped instead of starting the epoch over.
///   - Not thread-safe, like LibTorch's samplers.
class FULGOR_API DistributedSampler : public EpochSampler {
 public:
  /// Throws ConfigError when num_replicas < 1, rank is outside
  /// 0..num_replicas-1, or options asks for drop_last without even.
  DistributedSampler(size_t dataset_size, int64_t num_replicas, int64_t rank, DistributedSamplerOptions options = {});

  void set_epoch(uint64_t epoch) override;
  uint64_t epoch() const { return epoch_; }

  /// Rebuilds this rank's indices for the current epoch (for `new_size`
  /// samples when given) and rewinds, except right after load().
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  /// Up to `batch_size` next indices; nullopt when the shard is exhausted.
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;

  void save(torch::serialize::OutputArchive& archive) const override;
  /// Throws ConfigError when the archive was saved for another data set size,
  /// rank, replica count or options.
  void load(torch::serialize::InputArchive& archive) override;

  /// Samples this rank visits per epoch.
  size_t local_size() const;
  /// This rank's indices for the current epoch, in visiting order.
  const std::vector<size_t>& indices() const { return indices_; }
  /// How many of them next() has handed out.
  size_t position() const { return position_; }

 private:
  void build();

  size_t dataset_size_;
  int64_t num_replicas_;
  int64_t rank_;
  DistributedSamplerOptions options_;
  uint64_t epoch_ = 0;
  std::vector<size_t> indices_;
  size_t position_ = 0;
  bool keep_position_ = false;
};

}  // namespace fulgor
