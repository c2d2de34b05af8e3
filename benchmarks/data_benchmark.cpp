// Samples per second through LibTorch's make_data_loader with Stack<>
// collation against fulgor's TensorLoader, over the same in-memory data set of
// Fashion-MNIST's shape, shuffled, batch 32.

#include <torch/torch.h>

#include "benchmarks.h"
#include "fulgor/data/tensor_loader.h"

namespace fulgor::bench {

void data_benchmark(Report& report, const Settings& settings) {
  const int64_t samples = settings.quick ? 6000 : 60000, batch = 32;
  torch::manual_seed(0);
  auto images = torch::rand({samples, 1, 28, 28});
  auto labels = torch::randint(10, {samples}, torch::kLong);

  auto stacked = torch::data::make_data_loader(
      torch::data::datasets::TensorDataset(torch::cat({images.flatten(1), labels.unsqueeze(1).to(torch::kFloat)}, 1))
          .map(torch::data::transforms::Stack<torch::data::TensorExample>()),
      torch::data::DataLoaderOptions().batch_size(batch));
  TensorLoaderOptions options;
  options.batch_size = batch;
  options.shuffle = true;
  TensorLoader loader(images, labels, options);

  // Both sides touch every batch so neither is optimised away.
  double sink = 0;
  auto libtorch = [&] {
    for (auto& b : *stacked) sink += b.data.size(0);
  };
  auto fulgor = [&] {
    for (auto& b : loader) sink += b.data.size(0) + b.target.size(0);
  };
  auto medians = interleaved_medians({libtorch, fulgor}, settings.repeats);
  const double libtorch_rate = samples / medians[0], fulgor_rate = samples / medians[1];
  report.row({"data", "LibTorch make_data_loader + Stack<>", fmt::format("{:.0f} samples/s", libtorch_rate), ""});
  report.row({"data", "fulgor TensorLoader (shuffled)", fmt::format("{:.0f} samples/s", fulgor_rate),
              fmt::format("{:.1f}x", fulgor_rate / libtorch_rate)});
  report.figures["data_speedup"] = fulgor_rate / libtorch_rate;
  if (sink < 0) report.row({"impossible"});
}

}  // namespace fulgor::bench
