// fulgor::TarShards: WebDataset shards that Python's tarfile wrote.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fulgor/data/image_loader.h"
#include "fulgor/data/tar_shards.h"
#include "../support/thrown.h"
#include "image_encode.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

// 10 images in 2 classes as a folder, and the same samples in two shards
// that Python's tarfile writes (PAX format, its default), each sample a
// .png or .jpg, its .cls and a .json.
struct ShardedFolder {
  ShardedFolder() {
    root = fs::temp_directory_path() / ("fulgor_shards_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(reinterpret_cast<uintptr_t>(this)));
    for (int i = 0; i < 10; ++i) {
      const auto dir = root / "images" / ("c" + std::to_string(i / 5));
      fs::create_directories(dir);
      const auto pixels = test_picture(24, 20, 3, i);
      if (i % 2)
        write_bytes((dir / (std::to_string(i) + ".jpg")).string(), encode_jpeg(pixels, 24, 20, 3));
      else
        write_bytes((dir / (std::to_string(i) + ".png")).string(), encode_png(pixels, 24, 20, 3));
    }
    folder = std::make_shared<ImageFolder>((root / "images").string());
    std::ofstream script(root / "write.py");
    script << "import io, json, sys, tarfile\n"
              "root, samples = sys.argv[1], sys.argv[2:]\n"
              "for shard in range(2):\n"
              "    with tarfile.open(f'{root}/shard-{shard}.tar', 'w') as tar:\n"
              "        for i in range(shard * 5, shard * 5 + 5):\n"
              "            path, target = samples[2 * i], samples[2 * i + 1]\n"
              "            key = f'sample{i:04d}'\n"
              "            tar.add(path, arcname=key + path[path.rfind('.'):])\n"
              "            for ext, text in (('cls', target), ('json', json.dumps({'i': i}))):\n"
              "                data = text.encode()\n"
              "                info = tarfile.TarInfo(f'{key}.{ext}')\n"
              "                info.size = len(data)\n"
              "                tar.addfile(info, io.BytesIO(data))\n";
    script.close();
    std::string command = "python3 " + (root / "write.py").string() + " " + root.string();
    for (int64_t i = 0; i < folder->size(); ++i)
      command += " " + folder->name(i) + " " + std::to_string(folder->target(i));
    written = std::system(command.c_str()) == 0;
  }
  ~ShardedFolder() { fs::remove_all(root); }
  fs::path root;
  std::shared_ptr<ImageFolder> folder;
  bool written = false;
};

TEST(TarShards, ExpandsBracePatterns) {
  EXPECT_EQ(TarShards::expand("a-{08..10}.tar"), (std::vector<std::string>{"a-08.tar", "a-09.tar", "a-10.tar"}));
  EXPECT_EQ(TarShards::expand("{x,y}-{1..2}"), (std::vector<std::string>{"x-1", "x-2", "y-1", "y-2"}));
  EXPECT_EQ(TarShards::expand("plain.tar"), std::vector<std::string>{"plain.tar"});
  EXPECT_THROW(TarShards::expand("a-{3..1}.tar"), ConfigError);
  EXPECT_THROW(TarShards::expand("a-{1..2.tar"), ConfigError);
}

TEST(TarShards, ReadsWhatPythonsTarfileWroteAsTheFolderHoldsIt) {
  ShardedFolder data;
  ASSERT_TRUE(data.written) << "python3 could not write the shards";
  TarShards shards({(data.root / "shard-{0..1}.tar").string()});
  ASSERT_EQ(shards.size(), 10);
  EXPECT_EQ(shards.classes(), (std::vector<std::string>{"0", "1"}));
  std::vector<uint8_t> from_tar, from_file;
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(shards.target(i), data.folder->target(i));
    shards.read(i, from_tar);
    data.folder->read(i, from_file);
    EXPECT_EQ(from_tar, from_file) << shards.name(i);
  }
  EXPECT_NE(shards.name(6).find("shard-1.tar:sample0006.png"), std::string::npos) << shards.name(6);
  // Indexed, through a loader: the same permutation, so the same batches as from the folder.
  for (const char* shard : {"shard-0.tar", "shard-1.tar"}) TarShards::write_index((data.root / shard).string());
  ImageLoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  auto indexed = std::make_shared<TarShards>(std::vector<std::string>{(data.root / "shard-{0..1}.tar").string()});
  ASSERT_TRUE(indexed->indexed());
  ImageLoader a(indexed, ImageTransforms({RandomResizedCrop{{8}}}), options);
  ImageLoader b(data.folder, ImageTransforms({RandomResizedCrop{{8}}}), options);
  auto ib = b.begin();
  int64_t batches = 0;
  for (auto& batch : a) {
    EXPECT_TRUE(torch::equal(batch.data, ib->data));
    EXPECT_TRUE(torch::equal(batch.target, ib->target));
    ++ib;
    ++batches;
  }
  EXPECT_EQ(batches, 3);
}

TEST(TarShards, KeepsItsShardsOpenAcrossCopiesAndThreads) {
  ShardedFolder data;
  ASSERT_TRUE(data.written) << "python3 could not write the shards";
  auto shards = std::make_unique<TarShards>(std::vector<std::string>{(data.root / "shard-{0..1}.tar").string()});
  const TarShards copy = *shards;
  shards.reset();
  // Reads go to the descriptors opened when the shards were indexed: the
  // files' names are no longer needed (a reopening reader would fail here).
  fs::remove(data.root / "shard-0.tar");
  fs::remove(data.root / "shard-1.tar");
  std::vector<std::vector<uint8_t>> read(10);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int64_t i = t; i < 10; i += 2) copy.read(i, read[static_cast<size_t>(i)]);
    });
  for (auto& t : threads) t.join();
  std::vector<uint8_t> from_file;
  for (int64_t i = 0; i < 10; ++i) {
    data.folder->read(i, from_file);
    EXPECT_EQ(read[static_cast<size_t>(i)], from_file) << copy.name(i);
  }
}

TEST(TarShards, AnIndexFileGivesRandomAccessAndAStaleOneIsNamed) {
  ShardedFolder data;
  ASSERT_TRUE(data.written) << "python3 could not write the shards";
  const std::string pattern = (data.root / "shard-{0..1}.tar").string();
  EXPECT_EQ(TarShards({pattern}).streams(), (std::vector<int64_t>{5, 5})) << "plain shards are streams";
  for (const char* shard : {"shard-0.tar", "shard-1.tar"})
    EXPECT_EQ(TarShards::write_index((data.root / shard).string()), (data.root / shard).string() + ".idx");
  const TarShards indexed({pattern});
  EXPECT_TRUE(indexed.indexed());
  EXPECT_TRUE(indexed.streams().empty());
  EXPECT_FALSE(TarShards({pattern}, false).indexed()) << "use_index false ignores the index";
  ASSERT_EQ(indexed.size(), 10);
  std::vector<uint8_t> from_tar, from_file;
  for (int64_t i = 9; i >= 0; --i) {
    indexed.read(i, from_tar);
    data.folder->read(i, from_file);
    EXPECT_EQ(from_tar, from_file) << indexed.name(i);
    EXPECT_EQ(indexed.target(i), data.folder->target(i));
  }
  EXPECT_NE(indexed.name(6).find("shard-1.tar:sample0006.png"), std::string::npos) << indexed.name(6);
  auto error_of = [&] { return test::thrown_message<DataError>([&] { TarShards read({pattern}); }); };
  // A shard rewritten after its index was.
  std::ofstream((data.root / "shard-1.tar").string(), std::ios::app | std::ios::binary) << std::string(512, '\0');
  EXPECT_NE(error_of().find("shard-1.tar.idx' was written for a shard of"), std::string::npos) << error_of();
  std::ofstream((data.root / "shard-1.tar.idx").string()) << "offsets\n";
  EXPECT_NE(error_of().find("shard-1.tar.idx' is not a tar shard index"), std::string::npos) << error_of();
}

// Plain shards, recording the order the loader reads their samples in.
struct StreamRecorder final : ImageDataset {
  explicit StreamRecorder(std::shared_ptr<TarShards> inner) : inner(std::move(inner)) {}
  int64_t size() const override { return inner->size(); }
  void read(int64_t index, std::vector<uint8_t>& bytes) const override {
    {
      std::lock_guard<std::mutex> lock(m);
      reads.push_back(index);
    }
    inner->read(index, bytes);
  }
  int64_t target(int64_t index) const override { return inner->target(index); }
  std::string name(int64_t index) const override { return inner->name(index); }
  const std::vector<std::string>& classes() const override { return inner->classes(); }
  std::vector<int64_t> streams() const override { return inner->streams(); }
  std::shared_ptr<TarShards> inner;
  mutable std::mutex m;
  mutable std::vector<int64_t> reads;
};

std::vector<int64_t> read_order(const std::shared_ptr<TarShards>& shards, ImageLoaderOptions options, int64_t epoch) {
  auto recorder = std::make_shared<StreamRecorder>(shards);
  options.num_workers = 0;  // reads in the epoch's order
  ImageLoader loader(recorder, ImageTransforms({CenterCrop{{4}}}), options);
  loader.set_epoch(epoch);
  for (auto& batch : loader) (void)batch;
  return recorder->reads;
}

// Note [Streamed shards]
TEST(TarShards, PlainShardsStreamInShardOrderThroughAShuffleBuffer) {
  ShardedFolder data;
  ASSERT_TRUE(data.written) << "python3 could not write the shards";
  auto shards = std::make_shared<TarShards>(std::vector<std::string>{(data.root / "shard-{0..1}.tar").string()});
  ImageLoaderOptions options;
  options.batch_size = 3;
  const std::vector<int64_t> in_order{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(read_order(shards, options, 0), in_order);
  options.shuffle = true;
  options.shuffle_buffer = 1;  // the shards' order alone: each shard whole, in order
  std::set<std::vector<int64_t>> shard_orders;
  for (int64_t epoch = 0; epoch < 8; ++epoch) {
    const auto order = read_order(shards, options, epoch);
    ASSERT_EQ(order.size(), 10u);
    EXPECT_TRUE(std::is_sorted(order.begin(), order.begin() + 5) && std::is_sorted(order.begin() + 5, order.end()) &&
                order[0] % 5 == 0 && order[5] % 5 == 0)
        << fmt::format("{}", fmt::join(order, " "));
    shard_orders.insert(order);
  }
  EXPECT_EQ(shard_orders.size(), 2u) << "both orders of the two shards, over eight epochs";
  options.shuffle_buffer = 4;
  const auto a = read_order(shards, options, 3);
  EXPECT_EQ(a, read_order(shards, options, 3)) << "an epoch's order is a function of (seed, epoch)";
  EXPECT_NE(a, read_order(shards, options, 4));
  EXPECT_TRUE(std::is_permutation(a.begin(), a.end(), in_order.begin()));
  EXPECT_NE(a, in_order);
  options.shuffle_buffer = 0;
  EXPECT_THROW(ImageLoader(shards, ImageTransforms({CenterCrop{{4}}}), options), ConfigError);
}

// The resume guarantee holds for streamed shards: batch k onwards of an
// epoch, from start_at(k), whatever the workers.
TEST(TarShards, PlainShardsResumeMidEpochExactly) {
  ShardedFolder data;
  ASSERT_TRUE(data.written) << "python3 could not write the shards";
  auto shards = std::make_shared<TarShards>(std::vector<std::string>{(data.root / "shard-{0..1}.tar").string()});
  ImageLoaderOptions options;
  options.batch_size = 2;
  options.shuffle = true;
  options.shuffle_buffer = 3;
  const ImageTransforms augment({RandomResizedCrop{{8}}, RandomHorizontalFlip{}}, {3, torch::kByte});
  std::vector<torch::Tensor> whole;
  ImageLoader uninterrupted(shards, augment, options);
  uninterrupted.set_epoch(2);
  for (auto& batch : uninterrupted) whole.push_back(torch::cat({batch.data.flatten(), batch.target}));
  ASSERT_EQ(whole.size(), 5u);
  for (int64_t workers : {0, 2}) {
    options.num_workers = workers;
    auto recorder = std::make_shared<StreamRecorder>(shards);
    ImageLoader resumed(recorder, augment, options);
    resumed.set_epoch(2);
    resumed.start_at(3);
    size_t k = 3;
    for (auto& batch : resumed) {
      ASSERT_LT(k, whole.size());
      EXPECT_TRUE(torch::equal(torch::cat({batch.data.flatten(), batch.target}), whole[k])) << "batch " << k;
      ++k;
    }
    EXPECT_EQ(k, whole.size());
    EXPECT_EQ(recorder->reads.size(), 4u) << "only batches 3 and 4 are read";
  }
}

TEST(TarShards, AMissingShardOrATruncatedMemberIsNamed) {
  ShardedFolder data;
  ASSERT_TRUE(data.written) << "python3 could not write the shards";
  auto error_of = [](const std::vector<std::string>& shards) {
    try {
      TarShards read(shards);
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string missing = (data.root / "shard-{0..2}.tar").string();
  EXPECT_NE(error_of({missing}).find("shard-2.tar' cannot be opened"), std::string::npos) << error_of({missing});
  const auto cut = data.root / "cut.tar";
  fs::copy_file(data.root / "shard-0.tar", cut);
  // Python's tarfile writes a pax header (512 + 512 bytes) before the first image.
  fs::resize_file(cut, 1024 + 512 + 100);
  const std::string message = error_of({cut.string()});
  EXPECT_NE(message.find("is truncated"), std::string::npos) << message;
  EXPECT_NE(message.find("cut.tar': member 'sample0000.png' is truncated (100 of its"), std::string::npos) << message;
  // Cut after the last member, before the end-of-archive blocks.
  std::ifstream whole(data.root / "shard-0.tar", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
  const size_t members_end = (bytes.find_last_not_of('\0') / 512 + 1) * 512;
  fs::copy_file(data.root / "shard-0.tar", cut, fs::copy_options::overwrite_existing);
  fs::resize_file(cut, members_end);
  EXPECT_NE(
      error_of({cut.string()}).find(fmt::format("cut.tar' is truncated: it ends at byte {} without", members_end)),
      std::string::npos)
      << error_of({cut.string()});
  write_bytes((data.root / "text.tar").string(), std::vector<uint8_t>(1024, 'a'));
  EXPECT_NE(error_of({(data.root / "text.tar").string()}).find("not a tar archive"), std::string::npos);
}

}  // namespace
}  // namespace fulgor::testing
