#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fulgor/data/epoch_sampler.h"
#include "fulgor/data/prefetcher.h"
#include "fulgor/data/tensor_loader.h"
#include "fulgor/loops/step_runner.h"

namespace fulgor {
namespace {

// Sample i has data row [i, i] and target i, so a batch says which samples it holds.
TensorLoader make_loader(int64_t n, TensorLoaderOptions options) {
  auto ids = torch::arange(n, torch::kLong);
  return TensorLoader(ids.unsqueeze(1).repeat({1, 2}).to(torch::kFloat), ids, options);
}

std::vector<int64_t> epoch_targets(TensorLoader& loader, std::vector<int64_t>* sizes = nullptr) {
  std::vector<int64_t> targets;
  for (auto& batch : loader) {
    EXPECT_TRUE(torch::equal(batch.data.select(1, 0).to(torch::kLong), batch.target));
    if (sizes) sizes->push_back(batch.target.size(0));
    for (int64_t i = 0; i < batch.target.size(0); ++i) targets.push_back(batch.target[i].item<int64_t>());
  }
  return targets;
}

TEST(TensorLoader, InOrderBatchesCoverTheDataSet) {
  TensorLoaderOptions options;
  options.batch_size = 4;
  auto loader = make_loader(10, options);
  std::vector<int64_t> sizes;
  auto targets = epoch_targets(loader, &sizes);
  EXPECT_EQ(targets, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(loader.size(), 3);
}

// A Trainer leaves batches where they are when the loader says they are on
// its device already; the meta device stands for a second device here.
TEST(TensorLoader, SaysWhetherItsBatchesAreOnADevice) {
  const torch::Device cpu(torch::kCPU), meta(torch::kMeta);
  auto on_cpu = make_loader(6, {});
  EXPECT_TRUE(on_cpu.batches_on(cpu));
  EXPECT_FALSE(on_cpu.batches_on(meta));
  EXPECT_FALSE(on_cpu.batches_on(torch::Device(torch::kCUDA, 0)));
  const auto data = torch::zeros({6, 2}), targets = torch::zeros({6});
  EXPECT_FALSE(TensorLoader(data, targets.to(meta)).batches_on(cpu));
  EXPECT_FALSE(TensorLoader(data.to(meta), targets).batches_on(meta));
  EXPECT_TRUE(TensorLoader(data.to(meta), targets.to(meta)).batches_on(meta));
}

TEST(TensorLoader, DropLastDropsTheShortBatch) {
  TensorLoaderOptions options;
  options.batch_size = 4;
  options.drop_last = true;
  auto loader = make_loader(10, options);
  std::vector<int64_t> sizes;
  epoch_targets(loader, &sizes);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(loader.size(), 2);
}

TEST(TensorLoader, TheLargestBatchSizeIsOneBatch) {
  TensorLoaderOptions options;
  options.batch_size = std::numeric_limits<int64_t>::max();
  auto loader = make_loader(10, options);
  EXPECT_EQ(loader.size(), 1);
  std::vector<int64_t> sizes;
  epoch_targets(loader, &sizes);
  EXPECT_EQ(sizes, std::vector<int64_t>{10});
  options.drop_last = true;
  EXPECT_EQ(make_loader(10, options).size(), 0);
}

TEST(TensorLoader, ShuffleIsAPermutationThatChangesPerEpochAndReplays) {
  TensorLoaderOptions options;
  options.batch_size = 8;
  options.shuffle = true;
  options.seed = 42;
  auto loader = make_loader(50, options);
  auto first = epoch_targets(loader);
  auto second = epoch_targets(loader);
  EXPECT_EQ(std::set<int64_t>(first.begin(), first.end()).size(), 50u);
  EXPECT_NE(first, second);
  // Another loader with the same seed, set to epoch 1, plays the second order.
  auto replay = make_loader(50, options);
  replay.set_epoch(1);
  EXPECT_EQ(epoch_targets(replay), second);
  // Another seed, another order.
  options.seed = 43;
  auto other = make_loader(50, options);
  EXPECT_NE(epoch_targets(other), first);
}

TEST(TensorLoader, TakesASamplerForShards) {
  TensorLoaderOptions options;
  options.batch_size = 3;
  std::set<int64_t> seen;
  for (size_t rank = 0; rank < 2; ++rank) {
    auto ids = torch::arange(10, torch::kLong);
    TensorLoader loader(ids.unsqueeze(1).to(torch::kFloat), ids,
                        std::make_unique<torch::data::samplers::DistributedSequentialSampler>(10, 2, rank), options);
    EXPECT_EQ(loader.size(), 2);  // 5 samples per rank
    auto targets = epoch_targets(loader);
    EXPECT_EQ(targets.size(), 5u);
    for (int64_t t : targets) EXPECT_TRUE(seen.insert(t).second) << "sample " << t << " in two shards";
    EXPECT_EQ(epoch_targets(loader), targets) << "size() disturbed the sampler";
  }
  EXPECT_EQ(seen.size(), 10u);
}

// The Trainer's distribute under ddp: a shuffled loader's epochs, split
// disjointly over two ranks, the same order on both as in one process.
TEST(TensorLoader, DistributeReadsOneRanksShardOfEachEpochsOrder) {
  TensorLoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  options.seed = 7;
  auto whole = make_loader(10, options);
  EXPECT_TRUE(whole.distribute({1, 0, true})) << "one replica: nothing to do, but done";
  EXPECT_EQ(whole.size(), 3);
  std::vector<std::vector<int64_t>> unsharded;
  for (int epoch = 0; epoch < 2; ++epoch) unsharded.push_back(epoch_targets(whole));
  std::vector<TensorLoader> ranks;
  for (int64_t rank = 0; rank < 2; ++rank) {
    ranks.push_back(make_loader(10, options));
    EXPECT_TRUE(ranks.back().distribute({2, rank, true}));
    EXPECT_EQ(ranks.back().size(), 2) << "5 samples per rank";
  }
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> together;
    for (auto& loader : ranks) {
      std::vector<int64_t> sizes;
      const auto mine = epoch_targets(loader, &sizes);
      EXPECT_EQ(sizes, (std::vector<int64_t>{4, 1}));
      together.insert(together.end(), mine.begin(), mine.end());
    }
    // Rank r takes positions r, r + 2, ... of the one process's order.
    std::vector<int64_t> expected;
    for (int64_t rank = 0; rank < 2; ++rank)
      for (size_t i = static_cast<size_t>(rank); i < 10; i += 2) expected.push_back(unsharded[epoch][i]);
    EXPECT_EQ(together, expected) << "epoch " << epoch;
  }
  // set_epoch picks the epoch's order on every rank alike.
  for (auto& loader : ranks) loader.set_epoch(1);
  auto again0 = epoch_targets(ranks[0]);
  ranks[0].set_epoch(1);
  EXPECT_EQ(epoch_targets(ranks[0]), again0);
  std::vector<int64_t> expected1;
  for (size_t i = 1; i < 10; i += 2) expected1.push_back(unsharded[1][i]);
  EXPECT_EQ(epoch_targets(ranks[1]), expected1);
}

TEST(TensorLoader, DistributeUnevenlyRepeatsNoSampleAndUndoes) {
  TensorLoaderOptions options;
  options.batch_size = 2;
  std::vector<int64_t> seen;
  std::vector<int64_t> sizes;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto loader = make_loader(7, options);
    ASSERT_TRUE(loader.distribute({2, rank, /*even=*/false}));
    EXPECT_EQ(loader.size(), 2) << "4 or 3 samples in batches of 2";
    const auto mine = epoch_targets(loader);
    sizes.push_back(static_cast<int64_t>(mine.size()));
    seen.insert(seen.end(), mine.begin(), mine.end());
    // One replica: the whole data set again, in order.
    ASSERT_TRUE(loader.distribute({1, 0}));
    EXPECT_EQ(loader.size(), 4);
    EXPECT_EQ(epoch_targets(loader), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 3}));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  // Evenly: 4 samples each, one repeated.
  auto even = make_loader(7, options);
  ASSERT_TRUE(even.distribute({2, 1, true}));
  EXPECT_EQ(epoch_targets(even), (std::vector<int64_t>{1, 3, 5, 0}));
}

TEST(TensorLoader, DistributeLeavesAUsersSamplerAlone) {
  auto ids = torch::arange(10, torch::kLong);
  TensorLoader loader(ids.unsqueeze(1).to(torch::kFloat), ids,
                      std::make_unique<torch::data::samplers::SequentialSampler>(10), TensorLoaderOptions{});
  EXPECT_FALSE(loader.distribute({2, 1, true}));
  EXPECT_EQ(loader.size(), 1);
  EXPECT_EQ(epoch_targets(loader).size(), 10u);
}

TEST(TensorLoader, DisableShuffleKeepsTheShard) {
  TensorLoaderOptions options;
  options.batch_size = 10;
  options.shuffle = true;
  auto loader = make_loader(6, options);
  ASSERT_TRUE(loader.distribute({2, 1, true}));
  EXPECT_TRUE(loader.disable_shuffle());
  EXPECT_EQ(epoch_targets(loader), (std::vector<int64_t>{1, 3, 5}));
}

// Hands out 0..n-1 in order and keeps the epochs it is given.
struct EpochRecorder : EpochSampler {
  std::vector<uint64_t> epochs;
  size_t size = 0, position = 0;
  void set_epoch(uint64_t epoch) override { epochs.push_back(epoch); }
  void reset(c10::optional<size_t> new_size) override {
    if (new_size) size = *new_size;
    position = 0;
  }
  c10::optional<std::vector<size_t>> next(size_t batch_size) override {
    if (position == size) return c10::nullopt;
    std::vector<size_t> indices;
    for (; position < size && indices.size() < batch_size; ++position) indices.push_back(position);
    return indices;
  }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
};

TEST(TensorLoader, SetsAnEpochSamplersEpochAsEachIterationBegins) {
  auto owned = std::make_unique<EpochRecorder>();
  EpochRecorder& sampler = *owned;
  auto ids = torch::arange(6, torch::kLong);
  TensorLoaderOptions options;
  options.batch_size = 4;
  TensorLoader loader(ids.unsqueeze(1).to(torch::kFloat), ids, std::move(owned), options);
  EXPECT_EQ(loader.size(), 2);
  EXPECT_TRUE(sampler.epochs.empty()) << "size() set an epoch";
  EXPECT_EQ(epoch_targets(loader).size(), 6u);
  EXPECT_EQ(epoch_targets(loader).size(), 6u);
  loader.set_epoch(5);
  epoch_targets(loader);
  EXPECT_EQ(sampler.epochs, (std::vector<uint64_t>{0, 1, 5}));
}

// LibTorch's distributed samplers shuffle by their epoch too, which its
// Sampler<> interface does not carry.
TEST(TensorLoader, SetsTheEpochOfLibTorchsDistributedSamplers) {
  using torch::data::samplers::DistributedRandomSampler;
  auto ids = torch::arange(20, torch::kLong);
  TensorLoaderOptions options;
  options.batch_size = 4;
  TensorLoader loader(ids.unsqueeze(1).to(torch::kFloat), ids, std::make_unique<DistributedRandomSampler>(20, 2, 1),
                      options);
  std::vector<std::vector<int64_t>> epochs;
  for (size_t epoch = 0; epoch < 3; ++epoch) {
    const auto targets = epoch_targets(loader);
    // What the same sampler hands out, set to that epoch by hand.
    DistributedRandomSampler expected(20, 2, 1);
    expected.set_epoch(epoch);
    expected.reset(20);
    const auto indices = expected.next(20).value();
    EXPECT_EQ(targets, std::vector<int64_t>(indices.begin(), indices.end())) << "epoch " << epoch;
    epochs.push_back(targets);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
}

TEST(TensorLoader, RejectsBadInput) {
  EXPECT_THROW(TensorLoader(torch::zeros({4, 2}), torch::zeros({3})), ConfigError);
  TensorLoaderOptions zero;
  zero.batch_size = 0;
  EXPECT_THROW(TensorLoader(torch::zeros({4, 2}), torch::zeros({4}), zero), ConfigError);
  TensorLoaderOptions shuffled;
  shuffled.shuffle = true;
  EXPECT_THROW(TensorLoader(torch::zeros({4, 2}), torch::zeros({4}),
                            std::make_unique<torch::data::samplers::SequentialSampler>(4), shuffled),
               ConfigError);
}

// Pinned batches hold what unpinned ones do, in order, shuffled and sampled,
// and a DevicePrefetcher on CUDA asks its TensorLoader for them.
TEST(TensorLoader, PinnedBatchesHoldTheSameSamples) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "pinning host memory needs CUDA, which this machine lacks";
  for (const bool shuffle : {false, true}) {
    TensorLoaderOptions options;
    options.batch_size = 4;
    options.shuffle = shuffle;
    auto plain = make_loader(10, options);
    options.pin_memory = true;
    auto pinned = make_loader(10, options);
    std::vector<torch::Tensor> expected;
    for (auto& batch : plain) expected.push_back(batch.data);
    size_t i = 0;
    for (auto& batch : pinned) {
      EXPECT_TRUE(batch.data.is_pinned() && batch.target.is_pinned()) << "batch " << i << " shuffle " << shuffle;
      ASSERT_LT(i, expected.size());
      EXPECT_TRUE(torch::equal(batch.data, expected[i++]));
    }
    EXPECT_EQ(i, expected.size());
  }
  auto sampled = TensorLoader(torch::arange(6, torch::kFloat), torch::arange(6),
                              std::make_unique<torch::data::samplers::RandomSampler>(6), {.batch_size = 4});
  sampled.pin_memory();
  for (auto& batch : sampled)
    EXPECT_TRUE(batch.data.is_pinned() && torch::equal(batch.data.to(torch::kLong), batch.target));

  auto loader = make_loader(10, {.batch_size = 4, .shuffle = true});
  auto cuda = make_accelerator("cuda");
  DevicePrefetcher<TensorLoader> prefetcher(loader, *cuda, torch::Device(torch::kCUDA, 0));
  std::set<int64_t> seen;
  for (auto& batch : prefetcher) {
    EXPECT_TRUE(batch.data.is_cuda());
    const torch::Tensor ids = batch.target.cpu();
    for (int64_t j = 0; j < ids.numel(); ++j) seen.insert(ids[j].item<int64_t>());
  }
  EXPECT_TRUE(loader.options().pin_memory);
  EXPECT_EQ(seen.size(), 10u);
}

TEST(TensorLoader, PinMemoryWhereNothingCanPinSaysSo) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA can pin host memory here";
  try {
    make_loader(4, {.batch_size = 2, .pin_memory = true});
    FAIL() << "pin_memory was accepted by a LibTorch that cannot pin";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("TensorLoader pin_memory: this LibTorch cannot pin host memory"),
              std::string::npos)
        << e.what();
  }
  // A prefetcher on an accelerator without pinned memory asks for none.
  auto loader = make_loader(4, {.batch_size = 2});
  auto cpu = make_accelerator("cpu");
  DevicePrefetcher<TensorLoader> prefetcher(loader, *cpu, torch::Device(torch::kCPU));
  for (auto& batch : prefetcher) EXPECT_FALSE(batch.data.is_pinned());
  EXPECT_FALSE(loader.options().pin_memory);
}

TEST(DevicePrefetcher, HandsOutEveryBatchOnTheDevice) {
  TensorLoaderOptions options;
  options.batch_size = 4;
  auto loader = make_loader(10, options);
  auto cpu = make_accelerator("cpu");
  const torch::Device meta(torch::kMeta);
  DevicePrefetcher<TensorLoader> prefetcher(loader, *cpu, meta);
  std::vector<int64_t> sizes;
  for (auto& batch : prefetcher) {
    EXPECT_EQ(batch.data.device(), meta);
    EXPECT_EQ(batch.target.device(), meta);
    sizes.push_back(batch.data.size(0));
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
}

TEST(DevicePrefetcher, WrapsLibTorchDataLoaders) {
  auto ids = torch::arange(6, torch::kFloat);
  struct Data : torch::data::datasets::Dataset<Data> {
    torch::Tensor x;
    explicit Data(torch::Tensor t) : x(std::move(t)) {}
    torch::data::Example<> get(size_t i) override { return {x[i], x[i]}; }
    torch::optional<size_t> size() const override { return x.size(0); }
  };
  auto loader = torch::data::make_data_loader(Data(ids).map(torch::data::transforms::Stack<>()), 4);
  auto cpu = make_accelerator("cpu");
  DevicePrefetcher prefetcher(*loader, *cpu, torch::Device(torch::kCPU));  // deduces the loader type
  int64_t total = 0;
  for (auto& batch : prefetcher) total += batch.target.sum().item<int64_t>();
  EXPECT_EQ(total, 15);
}

// A loader of `n` one-element batches, each made when it is first read,
// counting the batches it has made.
struct CountingLoader {
  int64_t n = 0;
  int64_t made = 0;
  struct Iterator {
    CountingLoader* loader;
    int64_t i;
    std::optional<torch::data::Example<>> batch;
    torch::data::Example<>& operator*() {
      if (!batch) {
        ++loader->made;
        const auto value = torch::full({1}, static_cast<double>(i));
        batch.emplace(value, value);
      }
      return *batch;
    }
    Iterator& operator++() {
      ++i;
      batch.reset();
      return *this;
    }
    bool operator!=(const Iterator& other) const { return i != other.i; }
  };
  Iterator begin() { return Iterator{this, 0, std::nullopt}; }
  Iterator end() { return Iterator{this, n, std::nullopt}; }
};

TEST(DevicePrefetcher, FetchesTheNextBatchBeforeHandingOutTheCurrentOne) {
  CountingLoader loader{4};
  auto cpu = make_accelerator("cpu");
  DevicePrefetcher<CountingLoader> prefetcher(loader, *cpu, torch::Device(torch::kCPU));
  std::vector<int64_t> made_when_handed, values;
  for (auto& batch : prefetcher) {
    made_when_handed.push_back(loader.made);
    values.push_back(static_cast<int64_t>(batch.data.item<double>()));
  }
  EXPECT_EQ(values, (std::vector<int64_t>{0, 1, 2, 3}));
  // Batch k is handed out once batch k+1 exists (and its copy is issued).
  EXPECT_EQ(made_when_handed, (std::vector<int64_t>{2, 3, 4, 4}));
}

TEST(DevicePrefetcher, UnboundItRefusesToIterateAndPassesLengthAndEpochOn) {
  TensorLoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  auto loader = make_loader(10, options);
  DevicePrefetcher<TensorLoader> prefetcher(loader);
  try {
    prefetcher.begin();
    ADD_FAILURE() << "an unbound prefetcher iterated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without an accelerator and device"), std::string::npos) << e.what();
  }
  EXPECT_EQ(prefetcher.size(), 3);
  prefetcher.set_epoch(5);
  EXPECT_EQ(loader.epoch(), 5);

  auto cpu = make_accelerator("cpu");
  prefetcher.bind_device(*cpu, torch::Device(torch::kCPU));
  std::vector<int64_t> through_prefetcher;
  for (auto& batch : prefetcher)
    for (int64_t i = 0; i < batch.target.size(0); ++i) through_prefetcher.push_back(batch.target[i].item<int64_t>());
  loader.set_epoch(5);
  EXPECT_EQ(through_prefetcher, epoch_targets(loader));  // epoch 5's order

  EXPECT_TRUE(prefetcher.distribute({2, 0, true}));
  EXPECT_EQ(prefetcher.size(), 2);  // 5 samples of rank 0
  EXPECT_EQ(loader.size(), 2);
  static_assert(detail::has_distribute<DevicePrefetcher<TensorLoader>>::value);
  static_assert(!detail::has_distribute<DevicePrefetcher<std::vector<int>>>::value);
}

// A TensorLoader with start_at as well, recording it: a loader that offers
// every member of the loader protocol a wrapper is to pass on.
struct EveryMemberLoader {
  TensorLoader inner;
  std::optional<int64_t> started_at;
  int64_t size() const { return inner.size(); }
  void set_epoch(int64_t epoch) { inner.set_epoch(epoch); }
  bool disable_shuffle() { return inner.disable_shuffle(); }
  bool distribute(const DistributedShard& shard) { return inner.distribute(shard); }
  bool start_at(int64_t batch) {
    started_at = batch;
    return true;
  }
  std::vector<int64_t> batch_indices() const { return inner.batch_indices(); }
  TensorLoader::Iterator begin() { return inner.begin(); }
  TensorLoader::Iterator end() { return inner.end(); }
};

TEST(DevicePrefetcher, PassesEveryMemberOfTheLoaderProtocolOn) {
  using Prefetcher = DevicePrefetcher<EveryMemberLoader>;
  static_assert(detail::HasSize<Prefetcher>::value && detail::has_set_epoch<Prefetcher>::value &&
                detail::has_disable_shuffle<Prefetcher>::value && detail::has_distribute<Prefetcher>::value &&
                detail::has_start_at<Prefetcher>::value && detail::has_batch_indices<Prefetcher>::value &&
                detail::has_bind_device<Prefetcher>::value);
  // What its loader lacks, it lacks too.
  static_assert(!detail::has_disable_shuffle<DevicePrefetcher<CountingLoader>>::value &&
                !detail::has_start_at<DevicePrefetcher<CountingLoader>>::value &&
                !detail::has_batch_indices<DevicePrefetcher<CountingLoader>>::value);

  EveryMemberLoader loader{make_loader(10, {.batch_size = 4, .shuffle = true}), std::nullopt};
  auto cpu = make_accelerator("cpu");
  Prefetcher prefetcher(loader, *cpu, torch::Device(torch::kCPU));
  // The indices are those of the batch handed out, not of the one fetched ahead.
  int64_t batches = 0;
  for (auto& batch : prefetcher) {
    const auto targets = batch.target;
    std::vector<int64_t> ids(targets.data_ptr<int64_t>(), targets.data_ptr<int64_t>() + targets.numel());
    EXPECT_EQ(prefetcher.batch_indices(), ids) << "batch " << batches;
    if (batches++ < 2) {
      EXPECT_NE(loader.batch_indices(), ids) << "the loader is a batch ahead";
    }
  }
  EXPECT_EQ(batches, 3);

  EXPECT_TRUE(prefetcher.disable_shuffle());  // it was shuffling
  EXPECT_FALSE(prefetcher.disable_shuffle());
  EXPECT_FALSE(loader.inner.options().shuffle);
  EXPECT_TRUE(prefetcher.start_at(2));
  EXPECT_EQ(loader.started_at, 2);
  prefetcher.set_epoch(3);
  EXPECT_EQ(loader.inner.epoch(), 3);
  EXPECT_TRUE(prefetcher.distribute({2, 1, true}));
  EXPECT_EQ(prefetcher.size(), 2);
}

// A Trainer runs a loader given as an AnyLoader as it is, and a prefetcher's
// disable_shuffle reaches its loader through the Trainer's erased loader.
TEST(DevicePrefetcher, ItsLoaderStopsShufflingThroughTheStepRunner) {
  auto loader = make_loader(10, {.batch_size = 4, .shuffle = true});
  DevicePrefetcher<TensorLoader> prefetcher(loader);
  struct Net : BasicModule<torch::data::Example<>> {
    torch::Tensor training_step(torch::data::Example<> batch, int64_t) override { return batch.data.sum(); }
    OptimizerConfig configure_optimizers() override { return {}; }
  } net;
  auto runner = detail::make_runner(net, prefetcher);
  EXPECT_EQ(runner.length(), 3);
  EXPECT_TRUE(runner.disable_shuffle());
  EXPECT_FALSE(loader.options().shuffle);
  AnyLoader<> any(std::ref(loader));
  auto through_any = detail::make_runner(net, any);
  EXPECT_TRUE(through_any.distribute({2, 0, true}));
  EXPECT_EQ(through_any.length(), 2);
}

}  // namespace
}  // namespace fulgor
