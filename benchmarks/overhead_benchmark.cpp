// The Trainer against a hand-written LibTorch loop: same model, data, seed,
// batch size and optimizer, run interleaved. The hand-written loop slices
// pre-built tensors; the Trainer reads the same tensors through TensorLoader.
// fulgor's own work per step is (fulgor - raw) / steps.

#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "benchmarks.h"
#include "fulgor/data/tensor_loader.h"
#include "fulgor/module.h"
#include "fulgor/trainer.h"
#include "models.h"

namespace fulgor::bench {
namespace {

constexpr int64_t kBatch = 32;

struct Classifier : fulgor::Module {
  torch::nn::Sequential net;
  int logs = 0;
  Classifier(torch::nn::Sequential n, int log_calls) : net(register_module("net", std::move(n))), logs(log_calls) {}
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    auto loss = torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target);
    if (logs > 0) {
      fulgor::LogOptions options;
      options.prog_bar = true;
      log("train_loss", loss, options);
    }
    if (logs > 1) log("batch_mean", batch.data.mean());
    return loss;
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return fulgor::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
};

struct Variant {
  std::string name;
  bool progress_bar;
  int log_calls;
  bool checkpoint;
};

// Swallows what the Trainer prints while it is timed, so the table stays readable.
struct QuietStdout {
  std::ostringstream sink;
  std::streambuf* saved = std::cout.rdbuf(sink.rdbuf());
  ~QuietStdout() { std::cout.rdbuf(saved); }
};

}  // namespace

void overhead_benchmark(Report& report, const Settings& settings) {
  const int64_t samples = settings.quick ? 640 : 3200, epochs = settings.quick ? 1 : 3;
  const int64_t steps = epochs * (samples / kBatch);
  const std::vector<Variant> variants = {{"barebones", false, 0, false},
                                         {"progress bar + log()", true, 1, false},
                                         {"two log() calls", false, 2, false},
                                         {"checkpoint each epoch", false, 0, true}};
  const auto root = std::filesystem::temp_directory_path() / "fulgor-overhead-benchmark";

  for (const ModelSpec& spec : overhead_models()) {
    if (settings.quick && spec.name.rfind("cnn", 0) == 0) continue;
    std::vector<int64_t> shape{samples};
    shape.insert(shape.end(), spec.input_shape.begin(), spec.input_shape.end());
    torch::manual_seed(0);
    const auto data = torch::randn(shape);
    const auto targets = torch::randint(10, {samples}, torch::kLong);
    torch::manual_seed(1);
    const torch::nn::Sequential initial = spec.make();

    auto fresh = [&] {
      auto net = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(initial->clone());
      return torch::nn::Sequential(net);
    };
    // The trained models' outputs on the last batch: both sides must agree.
    const auto probe = data.narrow(0, samples - kBatch, kBatch);
    torch::Tensor raw_output, fulgor_output;
    auto raw = [&] {
      auto net = fresh();
      torch::Tensor loss;
      torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
      for (int64_t epoch = 0; epoch < epochs; ++epoch)
        for (int64_t start = 0; start + kBatch <= samples; start += kBatch) {
          optimizer.zero_grad();
          loss = torch::nn::functional::cross_entropy(net->forward(data.narrow(0, start, kBatch)),
                                                      targets.narrow(0, start, kBatch));
          loss.backward();
          optimizer.step();
        }
      torch::NoGradGuard no_grad;
      raw_output = net->forward(probe);
    };
    for (const Variant& variant : variants) {
      if (settings.quick && variant.checkpoint) continue;
      auto through_fulgor = [&] {
        Classifier model(fresh(), variant.log_calls);
        TensorLoaderOptions loader_options;
        loader_options.batch_size = kBatch;
        TensorLoader loader(data, targets, loader_options);
        TrainerOptions options;
        options.accelerator = "cpu";
        options.devices = 1;
        options.max_epochs = epochs;
        options.num_sanity_val_steps = 0;
        options.enable_model_summary = false;
        options.enable_progress_bar = variant.progress_bar;
        options.enable_checkpointing = variant.checkpoint;
        options.logger = false;
        options.default_root_dir = root.string();
        QuietStdout quiet;
        Trainer trainer(options);
        trainer.fit(model, loader);
        torch::NoGradGuard no_grad;
        fulgor_output = model.net->forward(probe);
      };
      auto medians = interleaved_medians({raw, through_fulgor}, settings.repeats);
      const bool same = torch::allclose(raw_output, fulgor_output, 1e-5, 1e-6);
      const double ratio = medians[1] / medians[0];
      const double own_us = (medians[1] - medians[0]) / steps * 1e6;
      report.row({"overhead", spec.name + ", " + variant.name, fmt::format("{:.1f} us/step", medians[1] / steps * 1e6),
                  fmt::format("{:.3f}x, {:+.1f} us/step{}", ratio, own_us, same ? "" : " (results differ!)")});
      const std::string key = spec.name.substr(0, spec.name.find(' '));
      if (variant.name == "barebones") {
        report.figures["overhead_ratio_" + key] = ratio;
        if (key == "linear") report.figures["overhead_us_tiny_barebones"] = own_us;
      }
      if (variant.name == "progress bar + log()") {
        report.figures["overhead_ratio_" + key + "_logging"] = ratio;
        if (key == "linear") report.figures["overhead_us_tiny"] = own_us;
      }
    }
  }
  std::filesystem::remove_all(root);
}

}  // namespace fulgor::bench
