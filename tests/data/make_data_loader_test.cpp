// fulgor::make_data_loader: LibTorch's loaders with a length, shardable over
// the ranks of a ddp job.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "fulgor/data/data_loader.h"
#include "fulgor/core/error.h"
#include "fulgor/config/seed.h"

namespace fulgor {
namespace {

// Example i is the number i.
struct Numbers : torch::data::datasets::Dataset<Numbers, torch::data::TensorExample> {
  explicit Numbers(size_t n) : n(n) {}
  torch::data::TensorExample get(size_t index) override {
    return torch::data::TensorExample(torch::tensor(static_cast<int64_t>(index)));
  }
  c10::optional<size_t> size() const override { return n; }
  size_t n;
};

template <typename Sampler = torch::data::samplers::RandomSampler>
auto numbers(size_t n, size_t batch) {
  return make_data_loader<Sampler>(Numbers(n).map(torch::data::transforms::Stack<torch::data::TensorExample>()), batch);
}

template <typename Loader>
std::vector<int64_t> epoch_of(Loader& loader, std::vector<int64_t>* sizes = nullptr) {
  std::vector<int64_t> seen;
  for (auto& batch : loader) {
    if (sizes) sizes->push_back(batch.data.size(0));
    for (int64_t i = 0; i < batch.data.size(0); ++i) seen.push_back(batch.data[i].template item<int64_t>());
  }
  return seen;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> range(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

TEST(MakeDataLoader, UnshardedReadsTheWholeDataSet) {
  auto loader = numbers<torch::data::samplers::SequentialSampler>(10, 4);
  EXPECT_EQ(loader.size(), 3);
  EXPECT_EQ(epoch_of(loader), range(10));
  auto shuffled = numbers(10, 4);
  EXPECT_EQ(sorted(epoch_of(shuffled)), range(10));
  static_assert(detail::has_distribute<decltype(loader)>::value);
  static_assert(detail::has_set_epoch<decltype(loader)>::value);
}

TEST(MakeDataLoader, ShardedRandomLoadersSplitOneSeededOrderPerEpoch) {
  seed_everything(123);
  std::vector<decltype(numbers(10, 3))> ranks;
  for (int64_t rank = 0; rank < 2; ++rank) {
    ranks.push_back(numbers(10, 3));
    EXPECT_TRUE(ranks.back().distribute({2, rank, true}));
    EXPECT_EQ(ranks.back().size(), 2) << "5 samples per rank";
  }
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> together;
    for (auto& loader : ranks) {
      loader.set_epoch(epoch);
      std::vector<int64_t> sizes;
      const auto mine = epoch_of(loader, &sizes);
      EXPECT_EQ(sizes, (std::vector<int64_t>{3, 2}));
      together.insert(together.end(), mine.begin(), mine.end());
    }
    EXPECT_EQ(sorted(together), range(10)) << "disjoint shards covering the data set, epoch " << epoch;
    epochs.push_back(together);
  }
  EXPECT_NE(epochs[0], epochs[1]) << "reshuffled per epoch";
  // The order is the DistributedSampler's from the global seed.
  DistributedSampler expected(10, 2, 1, {/*shuffle=*/true, /*seed=*/123, false});
  expected.set_epoch(1);
  ranks[1].set_epoch(1);
  const auto mine = epoch_of(ranks[1]);
  EXPECT_EQ(std::vector<size_t>(mine.begin(), mine.end()), expected.indices());
  // And the same on a rank whose process drew other random numbers since.
  torch::rand({100});
  ranks[1].set_epoch(1);
  EXPECT_EQ(epoch_of(ranks[1]), mine);
}

TEST(MakeDataLoader, ShardedSequentialLoadersSplitInOrderUnevenly) {
  std::vector<int64_t> together;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto loader = numbers<torch::data::samplers::SequentialSampler>(7, 2);
    EXPECT_TRUE(loader.distribute({2, rank, /*even=*/false}));
    EXPECT_EQ(loader.size(), 2);
    const auto mine = epoch_of(loader);
    EXPECT_EQ(mine, rank == 0 ? (std::vector<int64_t>{0, 2, 4, 6}) : (std::vector<int64_t>{1, 3, 5}));
    together.insert(together.end(), mine.begin(), mine.end());
    // One replica: everything again, through the requested sampler.
    EXPECT_TRUE(loader.distribute({1, 0}));
    EXPECT_EQ(loader.size(), 4);
    EXPECT_EQ(epoch_of(loader), range(7));
  }
  EXPECT_EQ(sorted(together), range(7));
}

// Any other sampler: its epoch's indices drawn, then split.
TEST(MakeDataLoader, ShardsOtherSamplersIndices) {
  std::vector<int64_t> together;
  for (int64_t rank = 0; rank < 3; ++rank) {
    auto loader = numbers<torch::data::samplers::DistributedSequentialSampler>(8, 2);
    // Unsharded, a DistributedSequentialSampler of one replica reads everything.
    EXPECT_TRUE(loader.distribute({3, rank, true}));
    EXPECT_EQ(loader.size(), 2);  // ceil(8 / 3) = 3 samples
    const auto mine = epoch_of(loader);
    EXPECT_EQ(mine.size(), 3u);
    together.insert(together.end(), mine.begin(), mine.end());
  }
  // 9 places for 8 samples: the first is repeated to pad.
  EXPECT_EQ(sorted(together), (std::vector<int64_t>{0, 0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(MakeDataLoader, RefusesBatchSizeZero) {
  try {
    numbers(10, 0);
    FAIL() << "batch_size 0 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("batch_size=0 is not valid: it must be >= 1"), std::string::npos) << e.what();
  }
}

// A batch size beyond the data set is one batch of all of it, even near SIZE_MAX.
TEST(MakeDataLoader, BatchSizeNearSizeMaxIsOneBatch) {
  const size_t huge = std::numeric_limits<size_t>::max() - 1;
  auto loader = numbers<torch::data::samplers::SequentialSampler>(10, huge);
  EXPECT_EQ(loader.size(), 1);
  std::vector<int64_t> sizes;
  EXPECT_EQ(epoch_of(loader, &sizes), range(10));
  EXPECT_EQ(sizes, std::vector<int64_t>{10});
  EXPECT_TRUE(loader.distribute({2, 1, true}));
  EXPECT_EQ(loader.size(), 1);
  auto dropped = fulgor::make_data_loader<torch::data::samplers::SequentialSampler>(
      Numbers(10).map(torch::data::transforms::Stack<torch::data::TensorExample>()),
      torch::data::DataLoaderOptions(huge).drop_last(true));
  EXPECT_EQ(dropped.size(), 0);
  EXPECT_TRUE(epoch_of(dropped).empty());
}

}  // namespace
}  // namespace fulgor
