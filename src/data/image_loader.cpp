#include "fulgor/data/image_loader.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "data/pinning.h"
#include "data/stream_order.h"
#include "fulgor/data/image_decode.h"
#include "fulgor/data/distributed_sampler.h"
#include "fulgor/core/error.h"

namespace fulgor {

// Note [Batches decoded in place]
// An epoch is a list of positions; batch k is positions [k B, (k + 1) B).
// Workers claim positions in order, each decoding its sample straight into
// its row of the batch tensor, which the first claim of a batch allocates
// (with its targets, known in advance). Claims stop prefetch_batches batches
// ahead of the one the iteration waits for, which bounds memory; a batch's
// slot is free again once the iteration has taken its tensors. Which thread
// decodes what changes nothing in a batch, so any number of workers, or none
// (the iterating thread then decodes), gives the same batches.
struct ImageLoader::Run {
  struct Slot {
    int64_t batch = -1;
    int64_t remaining = 0;
    torch::Tensor data, target;
    std::vector<std::string> failures;  // per row; empty: decoded
  };

  Run(const ImageLoader& loader, std::vector<size_t> positions, int64_t epoch_, int64_t first_batch)
      : dataset(loader.dataset_),
        transforms(loader.transforms_),
        options(loader.options_),
        skipped(loader.skipped_),
        epoch(epoch_),
        order(std::move(positions)),
        slots(static_cast<size_t>(options.prefetch_batches)) {
    const auto n = static_cast<int64_t>(order.size()), b = options.batch_size;
    total = options.drop_last ? n / b * b : n;
    consumed = std::min(first_batch, (total + b - 1) / b);
    next_position = std::min(consumed * b, total);
    for (int64_t i = 0; i < std::min<int64_t>(options.num_workers, total); ++i)
      threads.emplace_back([this] { work(); });
  }

  ~Run() {
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    wake_workers.notify_all();
    for (auto& t : threads) t.join();
  }

  // Lock held: whether a position is free to claim now.
  bool claimable() const {
    return next_position < total && next_position / options.batch_size < consumed + options.prefetch_batches;
  }

  // Lock held: claims the next position, allocating its batch on its first claim.
  std::pair<int64_t, void*> claim() {
    const int64_t position = next_position++;
    const int64_t batch = position / options.batch_size, row = position % options.batch_size;
    Slot& slot = slots[static_cast<size_t>(batch % options.prefetch_batches)];
    if (slot.batch != batch) allocate(slot, batch);
    auto* base = static_cast<uint8_t*>(slot.data.data_ptr());
    return {position, base + row * slot.data.stride(0) * static_cast<int64_t>(slot.data.element_size())};
  }

  void allocate(Slot& slot, int64_t batch) {
    const int64_t first = batch * options.batch_size;
    const int64_t rows = std::min(options.batch_size, total - first);
    slot.batch = batch;
    slot.remaining = rows;
    slot.failures.assign(static_cast<size_t>(rows), std::string());
    slot.data = torch::empty({rows, transforms->channels(), transforms->height(), transforms->width()},
                             torch::TensorOptions().dtype(transforms->dtype()).pinned_memory(options.pin_memory));
    slot.target = torch::empty({rows}, torch::TensorOptions().dtype(torch::kLong).pinned_memory(options.pin_memory));
    auto* targets = slot.target.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r)
      targets[r] = dataset->target(static_cast<int64_t>(order[static_cast<size_t>(first + r)]));
  }

  // Decodes position `position` into `out`, without the lock.
  struct Scratch {
    explicit Scratch(int64_t max_pixels) : decoder(max_pixels) {}
    ImageDecoder decoder;
    std::vector<uint8_t> bytes;
    DecodedImage image;
  };
  void make(Scratch& scratch, int64_t position, void* out) {
    const auto index = static_cast<int64_t>(order[static_cast<size_t>(position)]);
    std::string failure;
    try {
      dataset->read(index, scratch.bytes);
      const std::string name = dataset->name(index);
      const ImageHeader head = scratch.decoder.header(scratch.bytes.data(), scratch.bytes.size(), name);
      const ImageCrop crop = transforms->plan(head.width, head.height, options.seed, epoch, index);
      scratch.decoder.decode(scratch.bytes.data(), scratch.bytes.size(), name, transforms->request(crop),
                             scratch.image);
      transforms->apply(scratch.image, crop, out);
    } catch (const std::exception& e) {
      failure = e.what();
      if (failure.empty()) failure = dataset->name(index) + ": failed";
    }
    std::lock_guard<std::mutex> lock(m);
    Slot& slot = slots[static_cast<size_t>(position / options.batch_size % options.prefetch_batches)];
    slot.failures[static_cast<size_t>(position % options.batch_size)] = std::move(failure);
    if (--slot.remaining == 0) batch_ready.notify_all();
  }

  void work() {
    Scratch scratch(options.max_image_pixels);
    for (;;) {
      std::pair<int64_t, void*> task;
      {
        std::unique_lock<std::mutex> lock(m);
        wake_workers.wait(lock, [&] { return stop || next_position >= total || claimable(); });
        if (stop || next_position >= total) return;
        task = claim();
      }
      make(scratch, task.first, task.second);
    }
  }

  // The next batch into `out`; false at the epoch's end.
  bool next(Batch& out);
  // Takes the finished slot's tensors, leaving out or throwing for failures.
  bool take(Slot& slot, Batch& out);

  std::shared_ptr<const ImageDataset> dataset;
  std::shared_ptr<const ImageTransforms> transforms;
  ImageLoaderOptions options;
  std::shared_ptr<std::atomic<int64_t>> skipped;
  int64_t epoch;
  std::vector<size_t> order;
  int64_t total = 0;  // positions the batches cover
  std::vector<Slot> slots;
  std::mutex m;
  std::condition_variable wake_workers, batch_ready;
  int64_t next_position = 0, consumed = 0;
  bool stop = false;
  std::unique_ptr<Scratch> inline_scratch;  // num_workers 0
  std::vector<std::thread> threads;
};

bool ImageLoader::Run::next(Batch& out) {
  for (;;) {
    std::unique_lock<std::mutex> lock(m);
    if (consumed * options.batch_size >= total) return false;
    Slot& slot = slots[static_cast<size_t>(consumed % options.prefetch_batches)];
    if (threads.empty()) {
      // No workers: this thread decodes until the batch is whole.
      if (!inline_scratch) inline_scratch = std::make_unique<Scratch>(options.max_image_pixels);
      while (!(slot.batch == consumed && slot.remaining == 0)) {
        auto task = claim();
        lock.unlock();
        make(*inline_scratch, task.first, task.second);
        lock.lock();
      }
    } else {
      batch_ready.wait(lock, [&] { return slot.batch == consumed && slot.remaining == 0; });
    }
    const bool any = take(slot, out);
    ++consumed;
    lock.unlock();
    wake_workers.notify_all();
    if (any) return true;  // a batch whose every sample failed is left out
  }
}

bool ImageLoader::Run::take(Slot& slot, Batch& out) {
  std::vector<int64_t> keep;
  for (size_t r = 0; r < slot.failures.size(); ++r) {
    if (slot.failures[r].empty()) {
      keep.push_back(static_cast<int64_t>(r));
      continue;
    }
    if (!options.skip_corrupt) throw DataError(slot.failures[r]);
    const std::string message = fmt::format("ImageLoader: skipped a sample: {}", slot.failures[r]);
    if (options.warn)
      options.warn(message);
    else
      std::cerr << message << std::endl;
    ++*skipped;
  }
  out.data = std::move(slot.data);
  out.target = std::move(slot.target);
  slot.batch = -1;
  if (keep.size() < slot.failures.size()) {
    auto index = torch::tensor(keep, torch::kLong);
    out.data = out.data.index_select(0, index);
    out.target = out.target.index_select(0, index);
    // A batch with a sample left out is a new tensor: pinned again, or its copy would block.
    if (options.pin_memory) {
      out.data = out.data.pin_memory();
      out.target = out.target.pin_memory();
    }
  }
  return !keep.empty();
}

ImageLoader::ImageLoader(std::shared_ptr<const ImageDataset> dataset, ImageTransforms transforms,
                         ImageLoaderOptions options)
    : dataset_(std::move(dataset)),
      transforms_(std::make_shared<const ImageTransforms>(std::move(transforms))),
      options_(std::move(options)),
      skipped_(std::make_shared<std::atomic<int64_t>>(0)) {
  if (!dataset_) throw ConfigError("ImageLoader needs a data set, not a null pointer");
  if (options_.batch_size < 1)
    throw ConfigError(fmt::format("ImageLoader batch_size={} is not valid: it must be >= 1", options_.batch_size));
  if (options_.prefetch_batches < 1)
    throw ConfigError(
        fmt::format("ImageLoader prefetch_batches={} is not valid: it must be >= 1", options_.prefetch_batches));
  if (options_.num_workers < 0)
    throw ConfigError(
        fmt::format("ImageLoader num_workers={} is not valid: 0 (decode on the iterating thread) or more threads",
                    options_.num_workers));
  if (options_.shuffle_buffer < 1)
    throw ConfigError(
        fmt::format("ImageLoader shuffle_buffer={} is not valid: it must be >= 1", options_.shuffle_buffer));
  if (options_.pin_memory) detail::require_pinning("ImageLoader");
}

ImageLoader::~ImageLoader() = default;
ImageLoader::ImageLoader(ImageLoader&&) noexcept = default;
ImageLoader& ImageLoader::operator=(ImageLoader&&) noexcept = default;

int64_t ImageLoader::samples() const {
  return static_cast<int64_t>(
      shard_size(static_cast<size_t>(dataset_->size()), shard_.num_replicas, shard_.rank, shard_.even));
}

int64_t ImageLoader::size() const {
  const int64_t n = samples(), b = options_.batch_size;
  return options_.drop_last || n % b == 0 ? n / b : n / b + 1;
}

int64_t ImageLoader::skipped() const { return skipped_->load(); }

bool ImageLoader::distribute(const DistributedShard& shard) {
  // Checks the shard as a DistributedSampler would.
  shard_size(static_cast<size_t>(dataset_->size()), shard.num_replicas, shard.rank, shard.even);
  shard_ = shard;
  return true;
}

bool ImageLoader::start_at(int64_t batch) {
  if (batch < 0) throw ConfigError(fmt::format("ImageLoader start_at({}) is not valid: a batch index >= 0", batch));
  start_batch_ = batch;
  return true;
}

bool ImageLoader::disable_shuffle() { return std::exchange(options_.shuffle, false); }

void ImageLoader::pin_memory() {
  if (options_.pin_memory) return;
  detail::require_pinning("ImageLoader");
  options_.pin_memory = true;
}

// This rank's positions in the epoch's order, as a DistributedSampler gives.
std::vector<size_t> ImageLoader::epoch_order(int64_t epoch) const {
  const std::vector<int64_t> streams = dataset_->streams();
  DistributedSamplerOptions sampling;
  sampling.shuffle = options_.shuffle && streams.empty();
  sampling.seed = options_.seed;
  sampling.even = shard_.even;
  DistributedSampler sampler(static_cast<size_t>(dataset_->size()), shard_.num_replicas, shard_.rank, sampling);
  sampler.set_epoch(static_cast<uint64_t>(epoch));
  sampler.reset();
  if (streams.empty()) return sampler.indices();
  // Streams: the sampler's unshuffled split of the streamed order.
  const std::vector<size_t> streamed =
      detail::streamed_order(streams, options_.shuffle_buffer, options_.shuffle, options_.seed, epoch);
  std::vector<size_t> order;
  order.reserve(sampler.indices().size());
  for (const size_t position : sampler.indices()) order.push_back(streamed[position]);
  return order;
}

ImageLoader::Iterator ImageLoader::begin() {
  run_.reset();  // stops the workers of an epoch left unfinished
  const int64_t epoch = epoch_++;
  run_ = std::make_unique<Run>(*this, epoch_order(epoch), epoch, std::exchange(start_batch_, 0));
  return Iterator(this);
}

ImageLoader::Iterator::Iterator(ImageLoader* loader) : loader_(loader), done_(false) { ++*this; }

ImageLoader::Iterator& ImageLoader::Iterator::operator++() {
  done_ = !loader_->run_->next(batch_);
  return *this;
}

}  // namespace fulgor
