#pragma once

#include <torch/data/dataloader.h>
#include <torch/data/samplers/base.h>
#include <torch/data/samplers/random.h>
#include <torch/data/samplers/sequential.h>

#include <c10/util/Optional.h>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgor/data/loader_protocol.h"
#include "fulgor/data/distributed_sampler.h"
#include "fulgor/core/error.h"
#include "fulgor/config/seed.h"

namespace fulgor {
namespace detail {

// Note [Shardable LibTorch loaders]
// LibTorch's StatelessDataLoader keeps its sampler private and by value, so
// nothing outside it can change which indices it reads. make_data_loader
// gives it a ShardingSampler instead, which shares its state (the requested
// sampler among it) with the SizedDataLoader returned: distribute() there
// switches the sampler to one rank's shard, and set_epoch() chooses the
// epoch whose order the shard is cut from. Unsharded, it is the requested
// sampler. Sharded, a RandomSampler becomes a DistributedSampler shuffling
// from the seed seed_everything set (0 without one, as Lightning's
// PL_GLOBAL_SEED), a SequentialSampler one in order, and any other sampler
// has its epoch's indices drawn and split like a DistributedSampler's
// (Lightning's DistributedSamplerWrapper).
template <typename Sampler>
struct ShardingState {
  ShardingState(Sampler requested, size_t size) : inner(std::move(requested)), dataset_size(size) {}
  Sampler inner;
  size_t dataset_size;
  int64_t epoch = 0;  // the epoch the next iteration plays
  std::optional<DistributedShard> shard;
  std::unique_ptr<DistributedSampler> sharded;  // a RandomSampler's or SequentialSampler's shard
  std::vector<size_t> indices;                  // another sampler's shard of the epoch
  size_t position = 0;

  bool is_sharded() const { return shard && shard->num_replicas > 1; }
  void distribute(const DistributedShard& to) {
    shard = to;
    sharded.reset();
    indices.clear();
    position = 0;
    if (!is_sharded()) return;
    constexpr bool random = std::is_same_v<Sampler, torch::data::samplers::RandomSampler>;
    constexpr bool in_order = std::is_same_v<Sampler, torch::data::samplers::SequentialSampler>;
    if constexpr (random || in_order) {
      DistributedSamplerOptions options;
      options.shuffle = random;
      options.seed = global_seed().value_or(0);
      options.even = to.even;
      sharded = std::make_unique<DistributedSampler>(dataset_size, to.num_replicas, to.rank, options);
    } else {
      // Checks the shard as a DistributedSampler would.
      shard_size(dataset_size, to.num_replicas, to.rank, to.even);
    }
  }
};

template <typename Inner>
class ShardingSampler final : public torch::data::samplers::Sampler<> {
  static_assert(std::is_base_of_v<torch::data::samplers::Sampler<>, Inner>,
                "fulgor::make_data_loader takes samplers of indices (torch::data::samplers::Sampler<>)");

 public:
  explicit ShardingSampler(std::shared_ptr<ShardingState<Inner>> state) : state_(std::move(state)) {}

  void reset(c10::optional<size_t> new_size = c10::nullopt) override {
    auto& s = *state_;
    if (new_size) s.dataset_size = *new_size;
    if (!s.is_sharded()) {
      s.inner.reset(new_size);
      return;
    }
    const auto epoch = static_cast<uint64_t>(s.epoch++);
    if (s.sharded) {
      if (new_size) s.distribute(*s.shard);  // a sampler for the new size
      s.sharded->set_epoch(epoch);
      return;
    }
    s.inner.reset(new_size);
    std::vector<size_t> order;
    order.reserve(s.dataset_size);
    while (auto batch = s.inner.next(s.dataset_size > 0 ? s.dataset_size : 1))
      order.insert(order.end(), batch->begin(), batch->end());
    s.indices = shard_of(std::move(order), s.shard->num_replicas, s.shard->rank, s.shard->even);
    s.position = 0;
  }

  c10::optional<std::vector<size_t>> next(size_t batch_size) override {
    auto& s = *state_;
    if (!s.is_sharded()) return s.inner.next(batch_size);
    if (s.sharded) return s.sharded->next(batch_size);
    if (s.position >= s.indices.size()) return c10::nullopt;
    const size_t end = std::min(s.indices.size(), s.position + batch_size);
    std::vector<size_t> batch(s.indices.begin() + static_cast<std::ptrdiff_t>(s.position),
                              s.indices.begin() + static_cast<std::ptrdiff_t>(end));
    s.position = end;
    return batch;
  }

  void save(torch::serialize::OutputArchive& archive) const override { state_->inner.save(archive); }
  void load(torch::serialize::InputArchive& archive) override { state_->inner.load(archive); }

 private:
  std::shared_ptr<ShardingState<Inner>> state_;
};

}  // namespace detail

/// A LibTorch data loader that also tells how many batches an epoch has, which
/// fractional limits and val_check_interval need (LibTorch's loaders keep their
/// dataset and sampler private), and that can read one rank's shard
/// (distribute, which the Trainer calls under ddp). Iterates exactly like the
/// loader it wraps.
///
/// Made by fulgor::make_data_loader; `Sampler` is the sampler it was asked
/// for, which the loader reads through (Note [Shardable LibTorch loaders]).
template <typename Loader, typename Sampler = void>
class SizedDataLoader {
 public:
  SizedDataLoader(std::unique_ptr<Loader> loader, int64_t batches) : loader_(std::move(loader)), batches_(batches) {}
  SizedDataLoader(std::unique_ptr<Loader> loader, std::shared_ptr<detail::ShardingState<Sampler>> sharding,
                  size_t batch_size, bool drop_last)
      : loader_(std::move(loader)), sharding_(std::move(sharding)), batch_size_(batch_size), drop_last_(drop_last) {
    batches_ = batches_of(sharding_->dataset_size);
  }
  auto begin() { return loader_->begin(); }
  auto end() { return loader_->end(); }
  /// Batches per epoch (of the shard, once distributed).
  int64_t size() const { return batches_; }
  Loader& loader() { return *loader_; }

  /// The epoch the next iteration plays: a shard's order is that epoch's
  /// (the same on every rank). Without set_epoch, iterations count epochs.
  template <typename S = Sampler, typename = std::enable_if_t<!std::is_void_v<S>>>
  void set_epoch(int64_t epoch) {
    sharding_->epoch = epoch;
  }

  /// Reads only `shard` of the data set from the next iteration on
  /// (num_replicas 1: all of it again, through the requested sampler), and
  /// counts its batches in size(). Always succeeds: the sampler is fulgor's.
  template <typename S = Sampler, typename = std::enable_if_t<!std::is_void_v<S>>>
  bool distribute(const DistributedShard& shard) {
    sharding_->distribute(shard);
    const size_t n = sharding_->dataset_size;
    batches_ = batches_of(sharding_->is_sharded() ? shard_size(n, shard.num_replicas, shard.rank, shard.even) : n);
    return true;
  }

 private:
  // In size_t, as LibTorch takes the batch size: one near SIZE_MAX is one
  // batch of everything, not an overflow.
  int64_t batches_of(size_t samples) const {
    const size_t whole = samples / batch_size_;
    return static_cast<int64_t>(drop_last_ || samples % batch_size_ == 0 ? whole : whole + 1);
  }

  std::unique_ptr<Loader> loader_;
  std::shared_ptr<detail::ShardingState<Sampler>> sharding_;
  int64_t batches_ = 0;
  size_t batch_size_ = 1;
  bool drop_last_ = false;
};

/// torch::data::make_data_loader, returning a loader that knows its length and
/// can be sharded over the ranks of a ddp job (SizedDataLoader::distribute).
/// `Sampler` is constructed with the data set's size (RandomSampler: a new
/// order each epoch from LibTorch's generator; SequentialSampler: in order).
/// Requires a dataset whose size() is known and a batch_size >= 1 (throws
/// ConfigError otherwise).
template <typename Sampler = torch::data::samplers::RandomSampler, typename Dataset>
SizedDataLoader<torch::data::StatelessDataLoader<Dataset, detail::ShardingSampler<Sampler>>, Sampler> make_data_loader(
    Dataset dataset, torch::data::DataLoaderOptions options) {
  auto size = dataset.size();
  if (!size) throw ConfigError("fulgor::make_data_loader needs a dataset with a known size()");
  // size() divides by it, and LibTorch's samplers would hand out empty
  // batches without end.
  if (options.batch_size() == 0)
    throw ConfigError("fulgor::make_data_loader batch_size=0 is not valid: it must be >= 1");
  auto state = std::make_shared<detail::ShardingState<Sampler>>(Sampler(*size), *size);
  const size_t batch = options.batch_size();
  const bool drop_last = options.drop_last();
  return {
      torch::data::make_data_loader(std::move(dataset), detail::ShardingSampler<Sampler>(state), std::move(options)),
      state, batch, drop_last};
}

template <typename Sampler = torch::data::samplers::RandomSampler, typename Dataset>
SizedDataLoader<torch::data::StatelessDataLoader<Dataset, detail::ShardingSampler<Sampler>>, Sampler> make_data_loader(
    Dataset dataset, size_t batch_size) {
  return fulgor::make_data_loader<Sampler>(std::move(dataset), torch::data::DataLoaderOptions(batch_size));
}

}  // namespace fulgor
