#include "fulgor/distributed/sampler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>

#include "fulgor/error.h"

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

TEST(DistributedSampler, RejectsBadRankAndReplicas) {
  EXPECT_THROW(fulgor::DistributedSampler(10, 0, 0), fulgor::ConfigError);
  EXPECT_THROW(fulgor::DistributedSampler(10, 2, 2), fulgor::ConfigError);
  EXPECT_THROW(fulgor::DistributedSampler(10, 2, -1), fulgor::ConfigError);
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
