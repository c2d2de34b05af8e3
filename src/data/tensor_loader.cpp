#include "fulgor/data/tensor_loader.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <numeric>
#include <sstream>

#include "data/pinning.h"
#include "fulgor/data/epoch_sampler.h"
#include "fulgor/data/distributed_sampler.h"
#include "fulgor/core/error.h"

namespace fulgor {
namespace {

// Rows `index` of `source`, gathered straight into pinned memory when `pin`.
torch::Tensor select_rows(const torch::Tensor& source, const torch::Tensor& index, bool pin) {
  if (!pin) return source.index_select(0, index);
  std::vector<int64_t> shape = source.sizes().vec();
  shape[0] = index.size(0);
  torch::Tensor out = torch::empty(shape, source.options().pinned_memory(true));
  return torch::index_select_out(out, source, 0, index);
}

// Rows [position, position + count) of `source`, in pinned memory when `pin`.
torch::Tensor slice_rows(const torch::Tensor& source, int64_t position, int64_t count, bool pin) {
  torch::Tensor rows = source.narrow(0, position, count);
  return !pin || rows.is_pinned() ? rows : rows.pin_memory();
}

}  // namespace

TensorLoader::TensorLoader(torch::Tensor data, torch::Tensor targets, TensorLoaderOptions options)
    : TensorLoader(std::move(data), std::move(targets), nullptr, options) {}

TensorLoader::TensorLoader(torch::Tensor data, torch::Tensor targets,
                           std::unique_ptr<torch::data::samplers::Sampler<>> sampler, TensorLoaderOptions options)
    : data_(std::move(data)),
      targets_(std::move(targets)),
      sampler_(std::move(sampler)),
      user_sampler_(sampler_ != nullptr),
      options_(options) {
  if (!data_.defined() || data_.dim() == 0)
    throw ConfigError("TensorLoader needs data with a first (sample) dimension");
  if (!targets_.defined() || targets_.dim() == 0 || targets_.size(0) != data_.size(0))
    throw ConfigError(fmt::format("TensorLoader needs as many targets as samples: data has {} samples, targets {}",
                                  data_.size(0), targets_.defined() && targets_.dim() > 0 ? targets_.size(0) : 0));
  if (options_.batch_size < 1)
    throw ConfigError(fmt::format("TensorLoader batch_size={} is not valid: it must be >= 1", options_.batch_size));
  if (user_sampler_ && options_.shuffle)
    throw ConfigError("TensorLoader takes either shuffle=true or a sampler, not both: the sampler decides the order");
  if (options_.pin_memory) detail::require_pinning("TensorLoader");
}

bool TensorLoader::disable_shuffle() {
  const bool was = std::exchange(options_.shuffle, false);
  // A shard keeps its split with the order 0..n-1.
  if (was && shard_) distribute(*shard_);
  return was;
}

bool TensorLoader::distribute(const DistributedShard& shard) {
  if (user_sampler_) return false;
  if (shard.num_replicas == 1) {
    sampler_.reset();
    shard_.reset();
    return true;
  }
  DistributedSamplerOptions sharding;
  sharding.shuffle = options_.shuffle;
  sharding.seed = options_.seed;
  sharding.even = shard.even;
  sampler_ = std::make_unique<DistributedSampler>(static_cast<size_t>(dataset_size()), shard.num_replicas, shard.rank,
                                                  sharding);
  shard_ = shard;
  return true;
}

int64_t TensorLoader::size() const {
  // A sampler may hand out fewer indices than the data set holds (a shard).
  int64_t samples = dataset_size();
  if (shard_) {
    samples = static_cast<int64_t>(static_cast<const DistributedSampler&>(*sampler_).local_size());
  } else if (sampler_) {
    samples = 0;
    // Counting consumes the sampler, so count on a copy of its state.
    torch::serialize::OutputArchive saved;
    sampler_->save(saved);
    sampler_->reset(static_cast<size_t>(dataset_size()));
    while (auto indices = sampler_->next(static_cast<size_t>(options_.batch_size)))
      samples += static_cast<int64_t>(indices->size());
    std::stringstream buffer;
    saved.save_to(buffer);
    torch::serialize::InputArchive restored;
    restored.load_from(buffer);
    sampler_->load(restored);
  }
  // Not (samples + batch_size - 1) / batch_size, which overflows for the largest batch sizes.
  const int64_t whole = samples / options_.batch_size;
  return options_.drop_last || samples % options_.batch_size == 0 ? whole : whole + 1;
}

void TensorLoader::pin_memory() {
  // A DevicePrefetcher asks again as each epoch begins.
  if (options_.pin_memory) return;
  detail::require_pinning("TensorLoader");
  options_.pin_memory = true;
}

TensorLoader::Iterator TensorLoader::begin() {
  const int64_t epoch = epoch_++;
  if (sampler_) {
    // LibTorch's Sampler<> has no set_epoch; the loader's epoch is the one
    // set_epoch gave it (the Trainer's), or the count of iterations begun.
    if (auto* by_epoch = dynamic_cast<EpochSampler*>(sampler_.get()))
      by_epoch->set_epoch(static_cast<uint64_t>(epoch));
    else if (auto* libtorch = dynamic_cast<torch::data::samplers::DistributedSampler<>*>(sampler_.get()))
      libtorch->set_epoch(static_cast<size_t>(epoch));
    sampler_->reset(static_cast<size_t>(dataset_size()));
  } else if (options_.shuffle) {
    auto generator = at::detail::createCPUGenerator(options_.seed + static_cast<uint64_t>(epoch));
    order_ = torch::randperm(dataset_size(), generator, torch::kLong);
  } else {
    order_ = torch::Tensor();
  }
  return Iterator(this);
}

bool TensorLoader::next_batch(int64_t& position, Batch& batch) {
  const int64_t batch_size = options_.batch_size;
  const bool pin = options_.pin_memory;
  if (sampler_) {
    auto indices = sampler_->next(static_cast<size_t>(batch_size));
    if (!indices || indices->empty() || (options_.drop_last && static_cast<int64_t>(indices->size()) < batch_size))
      return false;
    auto index = torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()), torch::kLong);
    batch = Batch(select_rows(data_, index, pin), select_rows(targets_, index, pin));
    last_index_ = index;
    return true;
  }
  const int64_t remaining = dataset_size() - position;
  const int64_t count = std::min(batch_size, remaining);
  if (count <= 0 || (options_.drop_last && count < batch_size)) return false;
  if (order_.defined()) {
    auto index = order_.narrow(0, position, count);
    batch = Batch(select_rows(data_, index, pin), select_rows(targets_, index, pin));
    last_index_ = index;
  } else {
    last_index_.reset();
    last_start_ = position;
    last_count_ = count;
    // Field by field: no temporary batch (Note [The per-step path] in src/loops/training_epoch_loop.cpp).
    batch.data = slice_rows(data_, position, count, pin);
    batch.target = slice_rows(targets_, position, count, pin);
  }
  position += count;
  return true;
}

std::vector<int64_t> TensorLoader::batch_indices() const {
  if (last_index_.defined()) {
    auto index = last_index_.to(torch::kCPU, torch::kLong).contiguous();
    return {index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel()};
  }
  std::vector<int64_t> rows(static_cast<size_t>(last_count_));
  std::iota(rows.begin(), rows.end(), last_start_);
  return rows;
}

TensorLoader::Iterator::Iterator(TensorLoader* loader) : loader_(loader), done_(false) { ++*this; }

TensorLoader::Iterator& TensorLoader::Iterator::operator++() {
  done_ = !loader_->next_batch(position_, batch_);
  return *this;
}

}  // namespace fulgor
