// Samples per second through LibTorch's make_data_loader with Stack<>
// collation against fulgor's TensorLoader, shuffled, batch 32, over in-memory
// data sets of two shapes: the overhead benchmark's 64 features (the tiny
// model's data, where the per-sample work of Stack<> dominates: the headline
// data_speedup) and Fashion-MNIST's images (1x28x28 floats, where gathering
// 100 KB of scattered rows per batch bounds both loaders by memory). The LibTorch side reads the data set
// the way LibTorch's own torch::data::datasets::MNIST does: one example per
// index, images[i] and targets[i].

#include <torch/torch.h>

#include "benchmarks.h"
#include "fulgor/data/tensor_loader.h"

namespace fulgor::bench {
namespace {

struct InMemory : torch::data::datasets::Dataset<InMemory> {
  torch::Tensor images, targets;
  InMemory(torch::Tensor x, torch::Tensor y) : images(std::move(x)), targets(std::move(y)) {}
  torch::data::Example<> get(size_t index) override {
    const auto i = static_cast<int64_t>(index);
    return {images[i], targets[i]};
  }
  c10::optional<size_t> size() const override { return static_cast<size_t>(images.size(0)); }
};

struct Shape {
  std::string name, key;
  std::vector<int64_t> sample;
};

}  // namespace

void data_benchmark(Report& report, const Settings& settings) {
  const int64_t samples = settings.quick ? 6000 : 60000, batch = 32;
  for (const Shape& shape :
       {Shape{"64 features", "", {64}}, Shape{"fashion-mnist 1x28x28", "_fashion_mnist", {1, 28, 28}}}) {
    std::vector<int64_t> sizes{samples};
    sizes.insert(sizes.end(), shape.sample.begin(), shape.sample.end());
    torch::manual_seed(0);
    auto images = torch::rand(sizes);
    auto labels = torch::randint(10, {samples}, torch::kLong);

    auto stacked = torch::data::make_data_loader(InMemory(images, labels).map(torch::data::transforms::Stack<>()),
                                                 torch::data::samplers::RandomSampler(static_cast<size_t>(samples)),
                                                 torch::data::DataLoaderOptions().batch_size(batch));
    TensorLoaderOptions options;
    options.batch_size = batch;
    options.shuffle = true;
    TensorLoader loader(images, labels, options);

    // Both sides touch every batch so neither is optimised away.
    double sink = 0;
    auto libtorch = [&] {
      for (auto& b : *stacked) sink += b.data.size(0) + b.target.size(0);
    };
    auto fulgor = [&] {
      for (auto& b : loader) sink += b.data.size(0) + b.target.size(0);
    };
    auto medians = interleaved_medians({libtorch, fulgor}, settings.repeats);
    const double libtorch_rate = samples / medians[0], fulgor_rate = samples / medians[1];
    report.row({"data", shape.name + ", LibTorch make_data_loader + Stack<>",
                fmt::format("{:.0f} samples/s", libtorch_rate), ""});
    report.row({"data", shape.name + ", fulgor TensorLoader", fmt::format("{:.0f} samples/s", fulgor_rate),
                fmt::format("{:.1f}x", fulgor_rate / libtorch_rate)});
    report.figures["data_speedup" + shape.key] = fulgor_rate / libtorch_rate;
    if (sink < 0) report.row({"impossible"});
  }
}

}  // namespace fulgor::bench
