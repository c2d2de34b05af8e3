#include "fulgor/data/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

#include "fulgor/core/error.h"

namespace fulgor {
namespace {

int64_t read_int(torch::serialize::InputArchive& archive, const char* key) {
  torch::Tensor value;
  archive.read(key, value);
  return value.item<int64_t>();
}

void write_int(torch::serialize::OutputArchive& archive, const char* key, int64_t value) {
  archive.write(key, torch::tensor(value, torch::kInt64));
}

void check_shard(int64_t num_replicas, int64_t rank) {
  if (num_replicas < 1)
    throw ConfigError(fmt::format("num_replicas {} is not accepted: expected at least 1", num_replicas));
  if (rank < 0 || rank >= num_replicas)
    throw ConfigError(fmt::format("rank {} is not accepted: expected 0 to {}", rank, num_replicas - 1));
}

}  // namespace

size_t shard_size(size_t dataset_size, int64_t num_replicas, int64_t rank, bool even, bool drop_last) {
  check_shard(num_replicas, rank);
  const size_t replicas = static_cast<size_t>(num_replicas), r = static_cast<size_t>(rank);
  if (!even) return dataset_size > r ? (dataset_size - r + replicas - 1) / replicas : 0;
  return drop_last ? dataset_size / replicas : (dataset_size + replicas - 1) / replicas;
}

std::vector<size_t> shard_of(std::vector<size_t> order, int64_t num_replicas, int64_t rank, bool even, bool drop_last) {
  const size_t n = order.size();
  const size_t total = even ? shard_size(n, num_replicas, rank, true, drop_last) * static_cast<size_t>(num_replicas)
                            : (check_shard(num_replicas, rank), n);
  // Pad by repeating the order from its start, as many times as needed.
  for (size_t i = 0; order.size() < total && n > 0; ++i) order.push_back(order[i]);
  order.resize(total);
  std::vector<size_t> mine;
  mine.reserve(total / static_cast<size_t>(num_replicas) + 1);
  for (size_t i = static_cast<size_t>(rank); i < total; i += static_cast<size_t>(num_replicas))
    mine.push_back(order[i]);
  return mine;
}

DistributedSampler::DistributedSampler(size_t dataset_size, int64_t num_replicas, int64_t rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  check_shard(num_replicas, rank);
  if (options.drop_last && !options.even)
    throw ConfigError(
        "DistributedSampler drop_last=true with even=false is not accepted: an uneven split drops nothing; "
        "drop_last applies only with even=true");
  build();
}

size_t DistributedSampler::local_size() const {
  return shard_size(dataset_size_, num_replicas_, rank_, options_.even, options_.drop_last);
}

void DistributedSampler::set_epoch(uint64_t epoch) {
  epoch_ = epoch;
  build();
}

void DistributedSampler::build() {
  std::vector<size_t> order(dataset_size_);
  if (options_.shuffle && dataset_size_ > 0) {
    // torch::randperm with a generator seeded seed + epoch: the same order on
    // every rank, and the one PyTorch's sampler draws for the same seed.
    at::Generator generator = at::detail::createCPUGenerator(options_.seed + epoch_);
    torch::Tensor perm = torch::randperm(static_cast<int64_t>(dataset_size_), generator, torch::kInt64);
    const int64_t* data = perm.data_ptr<int64_t>();
    for (size_t i = 0; i < dataset_size_; ++i) order[i] = static_cast<size_t>(data[i]);
  } else {
    for (size_t i = 0; i < dataset_size_; ++i) order[i] = i;
  }
  indices_ = shard_of(std::move(order), num_replicas_, rank_, options_.even, options_.drop_last);
  position_ = 0;
}

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  const size_t kept = position_;
  if (new_size) dataset_size_ = *new_size;
  build();
  if (keep_position_ && !new_size) position_ = std::min(kept, indices_.size());
  keep_position_ = false;
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  if (position_ >= indices_.size()) return c10::nullopt;
  const size_t end = std::min(indices_.size(), position_ + batch_size);
  std::vector<size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(position_),
                            indices_.begin() + static_cast<std::ptrdiff_t>(end));
  position_ = end;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  write_int(archive, "dataset_size", static_cast<int64_t>(dataset_size_));
  write_int(archive, "num_replicas", num_replicas_);
  write_int(archive, "rank", rank_);
  write_int(archive, "shuffle", options_.shuffle ? 1 : 0);
  write_int(archive, "seed", static_cast<int64_t>(options_.seed));
  write_int(archive, "drop_last", options_.drop_last ? 1 : 0);
  write_int(archive, "even", options_.even ? 1 : 0);
  write_int(archive, "epoch", static_cast<int64_t>(epoch_));
  write_int(archive, "position", static_cast<int64_t>(position_));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  const auto expect = [&](const char* key, int64_t mine) {
    const int64_t saved = read_int(archive, key);
    if (saved != mine)
      throw ConfigError(fmt::format("DistributedSampler state with {} {} is not accepted: this sampler has {} {}", key,
                                    saved, key, mine));
  };
  expect("dataset_size", static_cast<int64_t>(dataset_size_));
  expect("num_replicas", num_replicas_);
  expect("rank", rank_);
  expect("shuffle", options_.shuffle ? 1 : 0);
  expect("seed", static_cast<int64_t>(options_.seed));
  expect("drop_last", options_.drop_last ? 1 : 0);
  // States saved before the uneven split existed were even.
  torch::Tensor even;
  const int64_t saved_even = archive.try_read("even", even) ? even.item<int64_t>() : 1;
  if (saved_even != (options_.even ? 1 : 0))
    throw ConfigError(fmt::format("DistributedSampler state with even {} is not accepted: this sampler has even {}",
                                  saved_even, options_.even ? 1 : 0));
  epoch_ = static_cast<uint64_t>(read_int(archive, "epoch"));
  const size_t position = static_cast<size_t>(read_int(archive, "position"));
  build();
  position_ = std::min(position, indices_.size());
  keep_position_ = true;
}

}  // namespace fulgor
