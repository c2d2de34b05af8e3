#include "fulgor/data/distributed_sampler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>

#include "fulgor/core/error.h"

namespace {

std::vector<size_t> drain(fulgor::DistributedSampler& sampler, size_t batch = 3) {
  std::vector<size_t> all;
  while (auto indices = sampler.next(batch)) all.insert(all.end(), indices->begin(), indices->end());
  return all;
}

std::vector<std::vector<size_t>> shards(size_t size, int64_t replicas, fulgor::DistributedSamplerOptions options,
                                        uint64_t epoch = 0) {
  std::vector<std::vector<size_t>> result;
  for (int64_t rank = 0; rank < replicas; ++rank) {
    fulgor::DistributedSampler sampler(size, replicas, rank, options);
    sampler.set_epoch(epoch);
    sampler.reset();
    result.push_back(drain(sampler));
  }
  return result;
}

TEST(DistributedSampler, PaddedShardsAreEqualDisjointAndCover) {
  for (bool shuffle : {false, true}) {
    const auto parts = shards(10, 3, {shuffle, /*seed=*/3, /*drop_last=*/false});
    std::map<size_t, int> seen;
    for (const auto& part : parts) {
      EXPECT_EQ(part.size(), 4u);  // ceil(10 / 3)
      for (size_t i : part) ++seen[i];
    }
    EXPECT_EQ(seen.size(), 10u) << "every sample is visited";
    int repeated = 0;
    for (const auto& [index, count] : seen) {
      EXPECT_LT(index, 10u);
      EXPECT_LE(count, 2);
      repeated += count - 1;
    }
    EXPECT_EQ(repeated, 2) << "12 places for 10 samples: 2 repeated to pad";
  }
}

TEST(DistributedSampler, DroppedShardsAreEqualAndDisjoint) {
  const auto parts = shards(10, 3, {/*shuffle=*/true, /*seed=*/3, /*drop_last=*/true});
  std::set<size_t> seen;
  for (const auto& part : parts) {
    EXPECT_EQ(part.size(), 3u);  // floor(10 / 3)
    for (size_t i : part) EXPECT_TRUE(seen.insert(i).second) << "index " << i << " in two shards";
  }
  EXPECT_EQ(seen.size(), 9u);
}

TEST(DistributedSampler, EvenSizeNeedsNoPadding) {
  const auto parts = shards(12, 4, {/*shuffle=*/true, /*seed=*/1, /*drop_last=*/false});
  std::set<size_t> seen;
  for (const auto& part : parts)
    for (size_t i : part) EXPECT_TRUE(seen.insert(i).second);
  EXPECT_EQ(seen.size(), 12u);
}

TEST(DistributedSampler, OrderDependsOnSeedAndEpochOnly) {
  const fulgor::DistributedSamplerOptions options{true, 42, false};
  EXPECT_EQ(shards(100, 2, options, 0), shards(100, 2, options, 0)) << "reproducible";
  EXPECT_NE(shards(100, 2, options, 0), shards(100, 2, options, 1)) << "reshuffled per epoch";
  EXPECT_NE(shards(100, 2, options, 0), shards(100, 2, {true, 43, false}, 0)) << "depends on the seed";
  // Without shuffling, rank r takes r, r + n, ...
  EXPECT_EQ(shards(6, 2, {false, 0, false}, 5)[1], (std::vector<size_t>{1, 3, 5}));
}

// The evaluation split: every sample once, no padding, shards one sample apart.
TEST(DistributedSampler, UnevenShardsCoverTheDataSetExactlyOnce) {
  for (bool shuffle : {false, true})
    for (size_t size : {0u, 1u, 7u, 10u, 12u})
      for (int64_t replicas : {1, 2, 3, 4}) {
        fulgor::DistributedSamplerOptions options;
        options.shuffle = shuffle;
        options.seed = 9;
        options.even = false;
        const auto parts = shards(size, replicas, options, 2);
        std::multiset<size_t> seen;
        size_t smallest = size, largest = 0;
        for (int64_t rank = 0; rank < replicas; ++rank) {
          const auto& part = parts[static_cast<size_t>(rank)];
          seen.insert(part.begin(), part.end());
          smallest = std::min(smallest, part.size());
          largest = std::max(largest, part.size());
          EXPECT_EQ(part.size(), fulgor::shard_size(size, replicas, rank, /*even=*/false));
          EXPECT_EQ(fulgor::DistributedSampler(size, replicas, rank, options).local_size(), part.size());
        }
        std::multiset<size_t> all;
        for (size_t i = 0; i < size; ++i) all.insert(i);
        EXPECT_EQ(seen, all) << size << " samples over " << replicas << " ranks, shuffle " << shuffle;
        EXPECT_LE(largest - std::min(smallest, largest), 1u) << size << " samples over " << replicas << " ranks";
      }
}

TEST(DistributedSampler, UnevenShardsTakeEveryNthOfTheEpochsOrder) {
  fulgor::DistributedSamplerOptions options;
  options.even = false;
  options.shuffle = false;
  EXPECT_EQ(shards(7, 3, options)[0], (std::vector<size_t>{0, 3, 6}));
  EXPECT_EQ(shards(7, 3, options)[2], (std::vector<size_t>{2, 5}));
  // Shuffled: the even split's order, unpadded (the same randperm of seed + epoch).
  options.shuffle = true;
  options.seed = 4;
  fulgor::DistributedSamplerOptions padded = options;
  padded.even = true;
  const auto uneven = shards(7, 2, options, 1), even = shards(7, 2, padded, 1);
  EXPECT_EQ(uneven[0], even[0]);
  EXPECT_EQ(uneven[1], std::vector<size_t>(even[1].begin(), even[1].end() - 1));
}

TEST(DistributedSampler, RejectsBadRankAndReplicas) {
  EXPECT_THROW(fulgor::DistributedSampler(10, 0, 0), fulgor::ConfigError);
  EXPECT_THROW(fulgor::DistributedSampler(10, 2, 2), fulgor::ConfigError);
  EXPECT_THROW(fulgor::DistributedSampler(10, 2, -1), fulgor::ConfigError);
  fulgor::DistributedSamplerOptions both;
  both.drop_last = true;
  both.even = false;
  try {
    fulgor::DistributedSampler(10, 2, 0, both);
    FAIL() << "drop_last with even=false was accepted";
  } catch (const fulgor::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("drop_last=true with even=false"), std::string::npos) << e.what();
  }
}

// A data set whose examples are their own index.
struct Indices : torch::data::datasets::Dataset<Indices, torch::data::TensorExample> {
  torch::data::TensorExample get(size_t index) override {
    return torch::data::TensorExample(torch::tensor(static_cast<int64_t>(index)));
  }
  c10::optional<size_t> size() const override { return 20; }
};

std::vector<int64_t> visit(fulgor::DistributedSampler sampler, size_t batches) {
  auto loader =
      torch::data::make_data_loader(Indices().map(torch::data::transforms::Stack<torch::data::TensorExample>()),
                                    std::move(sampler), torch::data::DataLoaderOptions().batch_size(2));
  std::vector<int64_t> seen;
  for (auto& batch : *loader) {
    for (int64_t i = 0; i < batch.data.size(0); ++i) seen.push_back(batch.data[i].item<int64_t>());
    if (--batches == 0) break;
  }
  return seen;
}

TEST(DistributedSampler, DrivesADataLoaderAndResumesMidEpoch) {
  const fulgor::DistributedSamplerOptions options{true, 5, false};
  fulgor::DistributedSampler sampler(20, 2, 1, options);
  sampler.set_epoch(3);
  const std::vector<size_t> expected = sampler.indices();
  ASSERT_EQ(expected.size(), 10u);

  // Through a loader: the rank's indices of epoch 3, in order.
  const std::vector<int64_t> whole = visit(sampler, 100);
  EXPECT_EQ(whole, std::vector<int64_t>(expected.begin(), expected.end()));

  // Saved after 2 batches, loaded into a fresh sampler: the loader goes on with the third.
  fulgor::DistributedSampler first(20, 2, 1, options);
  first.set_epoch(3);
  first.reset();
  first.next(2);
  first.next(2);
  torch::serialize::OutputArchive out;
  first.save(out);
  std::stringstream bytes;
  out.save_to(bytes);

  torch::serialize::InputArchive in;
  in.load_from(bytes);
  fulgor::DistributedSampler resumed(20, 2, 1, options);
  resumed.load(in);
  EXPECT_EQ(resumed.epoch(), 3u);
  const std::vector<int64_t> rest = visit(resumed, 100);
  EXPECT_EQ(rest, std::vector<int64_t>(expected.begin() + 4, expected.end()));
}

TEST(DistributedSampler, LoadRejectsStateOfAnotherSampler) {
  fulgor::DistributedSampler sampler(20, 2, 0);
  torch::serialize::OutputArchive out;
  sampler.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  fulgor::DistributedSampler other(20, 2, 1);
  EXPECT_THROW(other.load(in), fulgor::ConfigError);
}

}  // namespace
