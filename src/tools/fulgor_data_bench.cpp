// fulgor-data-bench: the image pipeline's throughput on a folder or shards
// (decode, RandomResizedCrop, flip, normalise), as docs/benchmarks.md runs it.

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/data/image_loader.h"
#include "fulgor/data/tar_shards.h"

namespace {

using Clock = std::chrono::steady_clock;

const char* usage =
    "usage: fulgor-data-bench PATH [--batch-size N] [--workers N] [--crop N] [--epochs N]\n"
    "PATH: an image folder (root/<class>/<images>) or tar shards (a path or brace pattern ending in .tar).\n"
    "Prints images per second through decode, RandomResizedCrop, flip and normalise, the time split\n"
    "between reading, decoding and transforming (one thread), and last a line of JSON.\n";

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Split {
  double read = 0, decode = 0, transform = 0;
  double full_decode = 0;       // decoding whole images, as a plain decoder would
  double cropped_decode = 0;    // the decode call alone, as the loader makes it
  double uncropped_decode = 0;  // at the crop's DCT scale, but all of the image
  int64_t samples = 0;
};

// One thread through the pipeline's stages, timed apart, over up to `limit` samples.
Split split_stages(const fulgor::ImageDataset& data, const fulgor::ImageTransforms& transforms, int64_t limit) {
  Split split;
  fulgor::ImageDecoder decoder;
  std::vector<uint8_t> bytes;
  fulgor::DecodedImage image;
  std::vector<float> out(static_cast<size_t>(transforms.channels() * transforms.height() * transforms.width()));
  for (int64_t i = 0; i < std::min(limit, data.size()); ++i) {
    auto t = Clock::now();
    data.read(i, bytes);
    split.read += seconds_since(t);
    t = Clock::now();
    const auto head = decoder.header(bytes.data(), bytes.size(), data.name(i));
    const auto crop = transforms.plan(head.width, head.height, 0, 0, i);
    decoder.decode(bytes.data(), bytes.size(), data.name(i), transforms.request(crop), image);
    split.decode += seconds_since(t);
    t = Clock::now();
    transforms.apply(image, crop, out.data());
    split.transform += seconds_since(t);
    t = Clock::now();
    decoder.decode(bytes.data(), bytes.size(), data.name(i), {transforms.channels()}, image);
    split.full_decode += seconds_since(t);
    // The decode alone, of the crop's blocks and of all, in alternating order (the second runs on warm caches).
    auto whole = transforms.request(crop);
    whole.crop = false;
    for (int pass = 0; pass < 2; ++pass) {
      const bool cut = (pass + i) % 2 == 0;
      t = Clock::now();
      decoder.decode(bytes.data(), bytes.size(), data.name(i), cut ? transforms.request(crop) : whole, image);
      (cut ? split.cropped_decode : split.uncropped_decode) += seconds_since(t);
    }
    ++split.samples;
  }
  return split;
}

struct Settings {
  std::string path;
  int64_t batch = 64, workers = 2, crop = 224, epochs = 1;
};

// The settings `args` give, or nullopt with the exit status in `status` where
// the program ends here (--help, or a command line it cannot use).
std::optional<Settings> parse(const std::vector<std::string>& args, int& status) {
  Settings settings;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::cout << usage;
      status = 0;
      return std::nullopt;
    }
    if (a.rfind("--", 0) == 0 && i + 1 < args.size()) {
      const int64_t v = std::stoll(args[++i]);
      if (a == "--batch-size")
        settings.batch = v;
      else if (a == "--workers")
        settings.workers = v;
      else if (a == "--crop")
        settings.crop = v;
      else if (a == "--epochs")
        settings.epochs = v;
      else
        throw fulgor::ConfigError(fmt::format("unknown option {}", a));
    } else if (settings.path.empty()) {
      settings.path = a;
    } else {
      settings.path.clear();
      break;
    }
  }
  if (settings.path.empty() || settings.epochs < 1) {
    std::cerr << usage;
    status = 2;
    return std::nullopt;
  }
  return settings;
}

struct Throughput {
  int64_t images = 0;
  double first_batch = -1, elapsed = 0;
};

Throughput load_all(fulgor::ImageLoader& loader, int64_t epochs) {
  Throughput measured;
  const auto start = Clock::now();
  for (int64_t e = 0; e < epochs; ++e)
    for (auto& b : loader) {
      if (measured.first_batch < 0) measured.first_batch = seconds_since(start);
      measured.images += b.data.size(0);
    }
  measured.elapsed = seconds_since(start);
  return measured;
}

void report(const Settings& settings, const std::string& source, const Throughput& measured, const Split& split,
            int64_t skipped) {
  const double rate = static_cast<double>(measured.images) / measured.elapsed;
  const double total = split.read + split.decode + split.transform;
  rusage usage_now{};
  getrusage(RUSAGE_SELF, &usage_now);
  const double peak_mb = static_cast<double>(usage_now.ru_maxrss) / 1024.0;
  const int64_t workers = settings.workers, threads = std::max<int64_t>(workers, 1);
  std::cout << fmt::format("{} images ({}) in {:.2f} s: {:.1f} images/s with {} workers, batch {}\n", measured.images,
                           source, measured.elapsed, rate, workers, settings.batch);
  std::cout << fmt::format("first batch after {:.3f} s; peak memory {:.0f} MB\n", measured.first_batch, peak_mb);
  // The limit of a loader that decodes whole images: one thread's full-decode rate times the threads.
  const double full_rate = static_cast<double>(split.samples) / split.full_decode;
  const double limit = full_rate * static_cast<double>(threads);
  const double per_image = 1e3 / static_cast<double>(split.samples);
  std::cout << fmt::format("one thread: read {:.0f}%, decode {:.0f}%, transform {:.0f}% ({:.2f} ms an image)\n",
                           100 * split.read / total, 100 * split.decode / total, 100 * split.transform / total,
                           per_image * split.transform);
  std::cout << fmt::format("full decode on one thread: {:.1f} images/s; x {} threads = {:.1f}, ratio {:.2f}\n",
                           full_rate, threads, limit, rate / limit);
  // What decoding only the crop's blocks saves over decoding all at the same scale.
  const double crop_gain = split.uncropped_decode / split.cropped_decode;
  std::cout << fmt::format("decode: {:.2f} ms an image of the crop's blocks, {:.2f} ms of all of it: {:.2f}x\n",
                           1e3 * split.cropped_decode / split.samples, 1e3 * split.uncropped_decode / split.samples,
                           crop_gain);
  std::cout << fmt::format(
      "{{\"images_per_second\": {:.2f}, \"images\": {}, \"seconds\": {:.3f}, \"time_to_first_batch_s\": {:.4f}, "
      "\"peak_rss_mb\": {:.1f}, \"workers\": {}, \"batch_size\": {}, \"crop\": {}, \"read_share\": {:.3f}, "
      "\"decode_share\": {:.3f}, \"transform_share\": {:.3f}, \"full_decode_per_second\": {:.2f}, "
      "\"full_decode_limit\": {:.2f}, \"crop_decode_gain\": {:.3f}, \"skipped\": {}}}\n",
      rate, measured.images, measured.elapsed, measured.first_batch, peak_mb, workers, settings.batch, settings.crop,
      split.read / total, split.decode / total, split.transform / total, full_rate, limit, crop_gain, skipped);
}

int run(const std::vector<std::string>& args) {
  int status = 0;
  const std::optional<Settings> settings = parse(args, status);
  if (!settings) return status;
  const std::string& path = settings->path;
  const bool shards = path.size() >= 4 && path.compare(path.size() - 4, 4, ".tar") == 0;
  std::shared_ptr<const fulgor::ImageDataset> data;
  if (shards)
    data = std::make_shared<fulgor::TarShards>(std::vector<std::string>{path});
  else
    data = std::make_shared<fulgor::ImageFolder>(path);
  const fulgor::ImageTransforms transforms({fulgor::RandomResizedCrop{{settings->crop}}, fulgor::RandomHorizontalFlip{},
                                            fulgor::Normalize{{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}}});
  fulgor::ImageLoaderOptions options;
  options.batch_size = settings->batch;
  options.num_workers = settings->workers;
  options.shuffle = true;
  fulgor::ImageLoader loader(data, transforms, options);
  const Throughput measured = load_all(loader, settings->epochs);
  const Split split = split_stages(*data, transforms, 256);
  report(*settings, fmt::format("{} {}", data->size(), shards ? "samples in shards" : "files"), measured, split,
         loader.skipped());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << "fulgor-data-bench: " << e.what() << "\n";
    return 1;
  }
}
