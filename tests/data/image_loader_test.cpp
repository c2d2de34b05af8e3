// fulgor::ImageLoader: threads decoding into batches that depend on the
// epoch's order alone.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/callback.h"
#include "fulgor/data/image_loader.h"
#include "fulgor/data/prefetcher.h"
#include "fulgor/module.h"
#include "fulgor/trainer.h"
#include "image_encode.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

// 23 images of 40 x 30 (JPEG and PNG) in 3 classes; `corrupt` adds one bad file.
struct LoaderFolder {
  explicit LoaderFolder(bool corrupt = false) {
    root = fs::temp_directory_path() / ("fulgor_loader_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(reinterpret_cast<uintptr_t>(this)));
    for (int i = 0; i < 23; ++i) {
      const auto dir = root / ("class" + std::to_string(i % 3));
      fs::create_directories(dir);
      const auto pixels = test_picture(40, 30, 3, i);
      if (i % 2)
        write_bytes((dir / (std::to_string(10 + i) + ".jpg")).string(), encode_jpeg(pixels, 40, 30, 3));
      else
        write_bytes((dir / (std::to_string(10 + i) + ".png")).string(), encode_png(pixels, 40, 30, 3));
    }
    if (corrupt) {
      auto jpeg = encode_jpeg(test_picture(40, 30, 3), 40, 30, 3);
      jpeg.resize(jpeg.size() / 2);
      write_bytes((root / "class1" / "broken.jpg").string(), jpeg);
    }
    dataset = std::make_shared<ImageFolder>(root.string());
  }
  ~LoaderFolder() { fs::remove_all(root); }
  fs::path root;
  std::shared_ptr<ImageFolder> dataset;
};

ImageTransforms augment() {
  return ImageTransforms({RandomResizedCrop{{16}}, RandomHorizontalFlip{}, Normalize{{0.5}, {0.25}}});
}

std::vector<torch::data::Example<>> epoch_batches(ImageLoader& loader) {
  std::vector<torch::data::Example<>> out;
  for (auto& batch : loader) out.push_back(batch);
  return out;
}

void expect_same(const std::vector<torch::data::Example<>>& a, const std::vector<torch::data::Example<>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].data, b[i].data)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].target, b[i].target)) << "batch " << i;
  }
}

TEST(ImageLoader, BatchesDependOnTheOrderAloneNotOnThreads) {
  LoaderFolder folder;
  ImageLoaderOptions options;
  options.batch_size = 5;
  options.shuffle = true;
  options.seed = 11;
  std::vector<std::vector<torch::data::Example<>>> runs;
  for (int64_t workers : {0, 1, 3}) {
    options.num_workers = workers;
    options.prefetch_batches = workers == 3 ? 1 : 2;
    ImageLoader loader(folder.dataset, augment(), options);
    EXPECT_EQ(loader.size(), 5);
    runs.push_back(epoch_batches(loader));
  }
  std::vector<int64_t> sizes;
  std::multiset<int64_t> targets;
  for (const auto& b : runs[0]) {
    sizes.push_back(b.data.size(0));
    EXPECT_EQ(b.data.sizes(), (std::vector<int64_t>{b.target.size(0), 3, 16, 16}));
    EXPECT_EQ(b.data.scalar_type(), torch::kFloat);
    for (int64_t i = 0; i < b.target.size(0); ++i) targets.insert(b.target[i].item<int64_t>());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{5, 5, 5, 5, 3}));
  EXPECT_EQ(targets.count(0), 8u);
  EXPECT_EQ(targets.count(1), 8u);
  EXPECT_EQ(targets.count(2), 7u);
  expect_same(runs[0], runs[1]);
  expect_same(runs[0], runs[2]);
}

// What a resumed run's Trainer does: set the epoch, and read again.
TEST(ImageLoader, AnEpochReplaysAndTheNextDiffers) {
  LoaderFolder folder;
  ImageLoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  ImageLoader loader(folder.dataset, augment(), options);
  const auto first = epoch_batches(loader);
  const auto second = epoch_batches(loader);
  EXPECT_FALSE(torch::equal(first[0].target, second[0].target) && torch::equal(first[0].data, second[0].data));
  ImageLoader resumed(folder.dataset, augment(), options);
  resumed.set_epoch(1);
  expect_same(epoch_batches(resumed), second);
  EXPECT_TRUE(resumed.disable_shuffle());
  resumed.set_epoch(0);
  const auto in_order = epoch_batches(resumed);
  EXPECT_TRUE(torch::equal(in_order[0].target, torch::tensor({0, 0, 0, 0}, torch::kLong)));
}

TEST(ImageLoader, DropLastAndAnUnfinishedEpoch) {
  LoaderFolder folder;
  ImageLoaderOptions options;
  options.batch_size = 5;
  options.drop_last = true;
  ImageLoader loader(folder.dataset, ImageTransforms({CenterCrop{{8}}}, {1, torch::kByte}), options);
  EXPECT_EQ(loader.size(), 4);
  const auto batches = epoch_batches(loader);
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(batches[0].data.sizes(), (std::vector<int64_t>{5, 1, 8, 8}));
  EXPECT_EQ(batches[0].data.scalar_type(), torch::kByte);
  // Left after one batch: the next epoch stops its workers and starts anew.
  for (auto& batch : loader) {
    EXPECT_EQ(batch.data.size(0), 5);
    break;
  }
  EXPECT_EQ(epoch_batches(loader).size(), 4u);
}

TEST(ImageLoader, RanksReadDisjointShardsEvenlyOrUnrepeated) {
  LoaderFolder folder;
  ImageLoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  for (bool even : {true, false}) {
    std::multiset<std::string> seen;
    std::vector<int64_t> lengths;
    for (int64_t rank = 0; rank < 2; ++rank) {
      ImageLoader loader(folder.dataset, ImageTransforms({CenterCrop{{8}}}, {3, torch::kByte}), options);
      EXPECT_TRUE(loader.distribute({2, rank, even}));
      lengths.push_back(loader.samples());
      for (auto& b : epoch_batches(loader))
        for (int64_t i = 0; i < b.data.size(0); ++i)
          seen.insert(std::to_string(b.target[i].item<int64_t>()) + ":" +
                      std::to_string(b.data[i].sum().item<int64_t>()));
    }
    EXPECT_EQ(lengths, even ? (std::vector<int64_t>{12, 12}) : (std::vector<int64_t>{12, 11}));
    EXPECT_EQ(seen.size(), even ? 24u : 23u);
    std::set<std::string> distinct(seen.begin(), seen.end());
    EXPECT_EQ(distinct.size(), 23u) << "every sample read, one of them twice when even";
  }
}

TEST(ImageLoader, ACorruptSampleIsSkippedNamedAndCountedOrAnError) {
  LoaderFolder folder(/*corrupt=*/true);
  ImageLoaderOptions options;
  options.batch_size = 6;
  options.num_workers = 2;
  std::vector<std::string> warnings;
  options.warn = [&](const std::string& w) { warnings.push_back(w); };
  ImageLoader loader(folder.dataset, ImageTransforms({CenterCrop{{8}}}), options);
  int64_t samples = 0;
  for (auto& b : epoch_batches(loader)) samples += b.data.size(0);
  EXPECT_EQ(samples, 23);
  EXPECT_EQ(loader.skipped(), 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("broken.jpg: corrupt or truncated JPEG"), std::string::npos) << warnings[0];
  options.skip_corrupt = false;
  ImageLoader strict(folder.dataset, ImageTransforms({CenterCrop{{8}}}), options);
  EXPECT_THROW(epoch_batches(strict), DataError);
}

// The CPU, saying whether it can pin host memory as it is told to, and
// recording how the batches were copied.
class PinningTestAccelerator final : public Accelerator {
 public:
  explicit PinningTestAccelerator(bool pinning) : pinning(pinning) {}
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "the CPU, as an accelerator with pinned memory or without"; }
  Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 1; }
  std::string distributed_backend() const override { return "gloo"; }
  bool supports_pinned_memory() const override { return pinning; }
  torch::Tensor move_tensor(const torch::Tensor& tensor, torch::Device device, bool non_blocking) const override {
    copies.emplace_back(tensor.is_pinned(), non_blocking);
    return tensor.to(device, non_blocking);
  }
  bool pinning;
  mutable std::vector<std::pair<bool, bool>> copies;  // (pinned, non_blocking)
};

// Pinned batches and non-blocking copies are the accelerator's decision,
// through DevicePrefetcher: asked of an ImageLoader where it supports them,
// never on the CPU.
TEST(ImageLoader, PinsAndCopiesWithoutBlockingWhereTheAcceleratorSupportsIt) {
  LoaderFolder folder;
  ImageLoaderOptions options;
  options.batch_size = 4;
  for (const bool pinning : {false, true}) {
    ImageLoader loader(folder.dataset, ImageTransforms({CenterCrop{{8}}}), options);
    PinningTestAccelerator accelerator(pinning);
    // To the meta device: a copy that moves nothing, but a copy.
    DevicePrefetcher<ImageLoader> prefetcher(loader, accelerator, torch::Device(torch::kMeta));
    if (pinning && !torch::cuda::is_available()) {
      // Asked to pin, a LibTorch that cannot says so rather than copying slowly.
      try {
        prefetcher.begin();
        FAIL() << "pinned batches from a LibTorch that cannot pin";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("ImageLoader pin_memory: this LibTorch cannot pin host memory"),
                  std::string::npos)
            << e.what();
      }
      continue;
    }
    int64_t batches = 0;
    for (auto& batch : prefetcher) batches += batch.data.is_meta() && batch.data.size(0) > 0;
    EXPECT_EQ(batches, loader.size());
    EXPECT_EQ(loader.options().pin_memory, pinning);
    ASSERT_EQ(accelerator.copies.size(), static_cast<size_t>(2 * batches));  // data and target
    for (const auto& [pinned, non_blocking] : accelerator.copies) {
      EXPECT_EQ(pinned, pinning);
      EXPECT_EQ(non_blocking, pinning);
    }
  }
}

TEST(ImageLoader, RejectsBadOptions) {
  LoaderFolder folder;
  auto with = [&](auto set) {
    ImageLoaderOptions options;
    set(options);
    return [&folder, options] { ImageLoader(folder.dataset, ImageTransforms({CenterCrop{{8}}}), options); };
  };
  EXPECT_THROW(with([](auto& o) { o.batch_size = 0; })(), ConfigError);
  EXPECT_THROW(with([](auto& o) { o.prefetch_batches = 0; })(), ConfigError);
  EXPECT_THROW(with([](auto& o) { o.num_workers = -1; })(), ConfigError);
  EXPECT_THROW(ImageLoader(nullptr, ImageTransforms({CenterCrop{{8}}})), ConfigError);
}

// An ImageFolder that counts the samples read.
struct CountedFolder final : ImageDataset {
  explicit CountedFolder(std::shared_ptr<ImageFolder> inner) : inner(std::move(inner)) {}
  int64_t size() const override { return inner->size(); }
  void read(int64_t index, std::vector<uint8_t>& bytes) const override {
    ++reads;
    inner->read(index, bytes);
  }
  int64_t target(int64_t index) const override { return inner->target(index); }
  std::string name(int64_t index) const override { return inner->name(index); }
  const std::vector<std::string>& classes() const override { return inner->classes(); }
  std::shared_ptr<ImageFolder> inner;
  mutable std::atomic<int64_t> reads{0};
};

// Records what each training step saw.
struct SeeingNet : fulgor::Module {
  SeeingNet() { fc = register_module("fc", torch::nn::Linear(3 * 8 * 8, 3)); }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    seen.push_back(batch.data.sum().item<double>() + 1000.0 * batch.target.sum().item<double>());
    return torch::cross_entropy_loss(fc(batch.data.flatten(1)), batch.target);
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01));
  }
  torch::nn::Linear fc{nullptr};
  std::vector<double> seen;
};

struct StopMidEpoch : fulgor::Callback {
  explicit StopMidEpoch(std::string path) : path(std::move(path)) {}
  void on_train_batch_end(Trainer& t, ModuleBase&, const torch::Tensor&, int64_t) override {
    if (t.current_epoch() != 1 || t.batches_in_epoch() != 2) return;
    t.save_checkpoint(path);
    t.request_stop("test stop");
  }
  std::string path;
};

// A run resumed from a checkpoint saved mid-epoch trains on exactly the
// batches the uninterrupted run did from there, and decodes none of the
// batches before it.
TEST(ImageLoader, AResumedFitSeesTheUninterruptedRunsBatches) {
  LoaderFolder folder;
  ImageLoaderOptions options;
  options.batch_size = 5;
  options.shuffle = true;
  options.seed = 3;
  auto loader_on = [&](std::shared_ptr<const ImageDataset> data) {
    return ImageLoader(std::move(data), ImageTransforms({RandomResizedCrop{{8}}, RandomHorizontalFlip{}}), options);
  };
  TrainerOptions trainer_options;
  trainer_options.accelerator = "cpu";
  trainer_options.devices = 1;
  trainer_options.logger = false;
  trainer_options.enable_checkpointing = false;
  trainer_options.enable_progress_bar = false;
  trainer_options.enable_model_summary = false;
  trainer_options.max_epochs = 3;
  trainer_options.default_root_dir = (folder.root / "runs").string();

  SeeingNet straight;
  auto straight_loader = loader_on(folder.dataset);
  Trainer(trainer_options).fit(straight, straight_loader);
  ASSERT_EQ(straight.seen.size(), 15u);

  const std::string checkpoint = (folder.root / "mid.ckpt").string();
  auto stopping = trainer_options;
  stopping.callbacks = {std::make_shared<StopMidEpoch>(checkpoint)};
  SeeingNet first;
  auto first_loader = loader_on(folder.dataset);
  Trainer(stopping).fit(first, first_loader);
  ASSERT_EQ(first.seen.size(), 7u);

  SeeingNet resumed;
  auto counted = std::make_shared<CountedFolder>(folder.dataset);
  auto resumed_loader = loader_on(counted);
  Trainer(trainer_options).fit(resumed, resumed_loader, {.ckpt_path = checkpoint});
  std::vector<double> expected(straight.seen.begin() + 7, straight.seen.end());
  EXPECT_EQ(resumed.seen, expected);
  EXPECT_EQ(counted->reads.load(), 23 - 2 * 5 + 23) << "the rest of epoch 1, then epoch 2";
}

}  // namespace
}  // namespace fulgor::testing
