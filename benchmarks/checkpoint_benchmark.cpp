// Saving and loading a 10-million-parameter model: a Trainer checkpoint (model,
// optimizer state, loop state, RNG states; written atomically) against
// torch::save / torch::load of the module alone.

#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "benchmarks.h"
#include "fulgor/checkpoint.h"
#include "fulgor/data/tensor_loader.h"
#include "fulgor/module.h"
#include "fulgor/trainer.h"

namespace fulgor::bench {
namespace {

struct Wide : fulgor::Module {
  torch::nn::Linear layer;
  explicit Wide(int64_t width) : layer(register_module("layer", torch::nn::Linear(width, width))) {}
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::mse_loss(layer->forward(batch.data), batch.target);
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return fulgor::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
};

}  // namespace

void checkpoint_benchmark(Report& report, const Settings& settings) {
  const int64_t width = settings.quick ? 1000 : 3162;  // 3162^2 + 3162 = 10.0 million parameters
  const auto dir = std::filesystem::temp_directory_path() / "fulgor-checkpoint-benchmark";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Wide model(width);
  TensorLoaderOptions loader_options;
  loader_options.batch_size = 2;
  TensorLoader loader(torch::randn({2, width}), torch::randn({2, width}), loader_options);
  TrainerOptions options;
  options.accelerator = "cpu";
  options.devices = 1;
  options.max_epochs = 1;
  options.enable_progress_bar = false;
  options.enable_model_summary = false;
  options.enable_checkpointing = false;
  options.logger = false;
  options.default_root_dir = dir.string();
  Trainer trainer(options);
  trainer.fit(model, loader);

  const std::string fulgor_path = (dir / "fulgor.ckpt").string(), raw_path = (dir / "raw.pt").string();
  std::shared_ptr<torch::nn::Module> as_module(&model, [](torch::nn::Module*) {});
  auto save = interleaved_medians(
      {[&] { torch::save(as_module, raw_path); }, [&] { trainer.save_checkpoint(fulgor_path); }}, settings.repeats);
  auto load = interleaved_medians(
      {[&] { torch::load(as_module, raw_path); }, [&] { load_module_weights(model, fulgor_path); }}, settings.repeats);
  const auto raw_bytes = std::filesystem::file_size(raw_path), fulgor_bytes = std::filesystem::file_size(fulgor_path);
  const int64_t parameters = width * width + width;
  report.row({"checkpoint", fmt::format("torch::save, {:.1f}M parameters", parameters / 1e6),
              fmt::format("{:.0f} ms, {:.1f} MB", save[0] * 1e3, raw_bytes / 1e6), ""});
  report.row({"checkpoint", "Trainer::save_checkpoint (+ optimizer, loop, RNG)",
              fmt::format("{:.0f} ms, {:.1f} MB", save[1] * 1e3, fulgor_bytes / 1e6),
              fmt::format("{:.2f}x time", save[1] / save[0])});
  report.row({"checkpoint", "torch::load", fmt::format("{:.0f} ms", load[0] * 1e3), ""});
  report.row({"checkpoint", "fulgor::load_module_weights", fmt::format("{:.0f} ms", load[1] * 1e3),
              fmt::format("{:.2f}x time", load[1] / load[0])});
  report.figures["checkpoint_save_ratio"] = save[1] / save[0];
  report.figures["checkpoint_load_ratio"] = load[1] / load[0];
  std::filesystem::remove_all(dir);
}

}  // namespace fulgor::bench
