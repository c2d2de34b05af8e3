// Steps per second on an accelerator, side by side: a hand-written LibTorch
// loop, the Trainer bare (no progress bar, logger, checkpoints or summary),
// the Trainer at its defaults logging the loss to the progress bar every
// step (its end-of-epoch checkpoint not timed), and the Trainer bare with fulgor::Adam's fused step (foreach where
// this LibTorch has no fused kernel for the device). All use Adam(1e-3) on
// the same network and the same synthetic batches, held in pinned host memory
// where the device can copy from it asynchronously, and copied each step.
//
// Note [Timing steps on a device]
// A device runs behind the host, so a clock read on the host measures what
// the host has queued, not what the device has done. Each run takes kWarmup
// steps first (allocator, kernels' first launches, autotuning), then
// synchronises the device and starts the clock, and synchronises again after
// its last step: the figure is the timed steps over that time. The Trainer's
// runs do this from a callback at the same steps; a run is one epoch, and the
// clock stops as it ends, before the checkpoint the Trainer's defaults save
// then (what a checkpoint costs is the checkpoint benchmark's). Runs of all variants are
// interleaved (harness.h), so that the device's clocks and temperature drift
// over all alike; the table gives each variant's median over the repeats
// with their range, and its ratio to the hand-written loop's median.
//
//   fulgor-benchmarks --only gpu [--device cuda] [--quick]
//
// --quick runs tiny sizes and few steps, to check that the benchmark runs
// (on the CPU too: --device cpu).

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include "benchmarks.h"
#include "fulgor/core/accelerator.h"
#include "fulgor/core/registry.h"
#include "fulgor/data/tensor_loader.h"
#include "fulgor/module.h"
#include "fulgor/optim/adam.h"
#include "fulgor/precision/precision.h"
#include "fulgor/trainer.h"
#include "loops.h"

namespace fulgor::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct DeviceModel {
  std::string name;
  std::function<torch::nn::Sequential()> make;
  std::vector<int64_t> input_shape;  // one sample's
  int64_t batch;
  std::vector<std::string> precisions;
};

std::vector<DeviceModel> device_models(bool quick) {
  namespace nn = torch::nn;
  auto mlp = [](int64_t in, int64_t hidden, int64_t hidden2) {
    return [=] {
      return nn::Sequential(nn::Linear(in, hidden), nn::ReLU(), nn::Linear(hidden, hidden2), nn::ReLU(),
                            nn::Linear(hidden2, 10));
    };
  };
  // The quick start's network (examples/fashion_mnist).
  auto cnn = [] {
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 16, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                          nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                          nn::Flatten(), nn::Linear(32 * 7 * 7, 64), nn::ReLU(), nn::Linear(64, 10));
  };
  const std::vector<std::string> both{"32", "bf16-mixed"};
  if (quick)
    return {{"mlp 32-32-32-10, batch 8", mlp(32, 32, 32), {32}, 8, both},
            {"quick start cnn, batch 4", cnn, {1, 28, 28}, 4, {"32"}}};
  return {{"mlp 1024-1024-1024-10, batch 256", mlp(1024, 1024, 1024), {1024}, 256, both},
          {"quick start cnn, batch 128", cnn, {1, 28, 28}, 128, both},
          {"mlp 4096-8192-8192-10 (100M), batch 2048", mlp(4096, 8192, 8192), {4096}, 2048, {"bf16-mixed"}}};
}

struct Run {
  int64_t warmup, steps;  // steps in all, warm-up included
};

// What each run shares: the device, the data and the network's starting point.
struct Setup {
  const Accelerator& accelerator;
  torch::Device device;
  torch::Tensor data, targets;  // pinned where the device copies from pinned memory asynchronously
  int64_t batch;
  torch::nn::Sequential initial;
  Run run;
  bool fused_kernel;  // whether fulgor::Adam has a fused kernel for the device
};

torch::nn::Sequential copied_net(const torch::nn::Sequential& net) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone()));
}

bool has_fused_kernel(torch::Device device) {
  try {
    auto p = torch::zeros({1}, torch::TensorOptions().device(device).requires_grad(true));
    p.mutable_grad() = torch::ones_like(p);
    Adam(std::vector<torch::Tensor>{p}, torch::optim::AdamOptions(1e-3), fused_or_foreach(true)).step();
    return true;
  } catch (const DeviceError&) {
    return false;
  }
}

// Note [Timing steps on a device]
double steps_per_second(const Setup& s, Clock::time_point start) {
  s.accelerator.synchronize(s.device);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(s.run.steps - s.run.warmup) / seconds;
}

// The loop a LibTorch user writes: batches copied to the device without
// blocking, autocast around the forward pass for bf16-mixed.
double hand_written(const Setup& s, const std::string& precision) {
  auto net = copied_net(s.initial);
  net->to(s.device);
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(1e-3));
  const bool bf16 = precision == "bf16-mixed";
  const Precision mixed = Precision::parse("bf16-mixed", s.accelerator);
  Clock::time_point start;
  for (int64_t step = 0; step < s.run.steps; ++step) {
    if (step == s.run.warmup) {
      s.accelerator.synchronize(s.device);
      start = Clock::now();
    }
    const int64_t at = step * s.batch;
    auto x = s.data.narrow(0, at, s.batch).to(s.device, /*non_blocking=*/true);
    auto y = s.targets.narrow(0, at, s.batch).to(s.device, /*non_blocking=*/true);
    optimizer.zero_grad();
    torch::Tensor loss;
    if (bf16) {
      // LibTorch's autocast calls, which differ between 1.13 and 2.x, as the
      // Trainer makes them.
      AutocastScope autocast(mixed, s.accelerator);
      loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    } else {
      loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    }
    loss.backward();
    optimizer.step();
  }
  return steps_per_second(s, start);
}

struct DeviceClassifier : Module {
  torch::nn::Sequential net;
  bool log_loss;
  std::optional<StepKernels> kernels;  // fulgor::Adam's; torch::optim::Adam without
  DeviceClassifier(torch::nn::Sequential n, bool log, std::optional<StepKernels> k)
      : net(register_module("net", std::move(n))), log_loss(log), kernels(k) {}
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    auto loss = torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target);
    if (log_loss) {
      LogOptions options;
      options.prog_bar = true;
      log("loss", loss, options);
    }
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    const torch::optim::AdamOptions options(1e-3);
    if (kernels) return OptimizerConfig(std::make_shared<Adam>(parameters(), options, *kernels));
    return OptimizerConfig(std::make_shared<torch::optim::Adam>(parameters(), options));
  }
};

// Starts the clock after the warm-up steps and reads it as the epoch ends,
// before the end-of-epoch checkpoint of the Trainer's defaults.
struct StepTimer : Callback {
  const Setup& s;
  Clock::time_point start;
  double result = 0;
  explicit StepTimer(const Setup& setup) : s(setup) {}
  void on_train_batch_start(Trainer& trainer, ModuleBase&, int64_t) override {
    if (trainer.global_step() == s.run.warmup) {
      s.accelerator.synchronize(s.device);
      start = Clock::now();
    }
  }
  void on_train_epoch_end(Trainer&, ModuleBase&) override { result = steps_per_second(s, start); }
};

// Swallows what the Trainer prints while it is timed, so the table stays readable.
struct SilentStdout {
  std::ostringstream sink;
  std::streambuf* saved = std::cout.rdbuf(sink.rdbuf());
  ~SilentStdout() { std::cout.rdbuf(saved); }
};

double through_fulgor(const Setup& s, const std::string& precision, bool defaults, std::optional<StepKernels> kernels,
                      const std::string& root) {
  DeviceClassifier model(copied_net(s.initial), defaults, kernels);
  TensorLoaderOptions loader_options;
  loader_options.batch_size = s.batch;
  loader_options.drop_last = true;
  TensorLoader loader(s.data, s.targets, loader_options);
  auto timer = std::make_shared<StepTimer>(s);
  TrainerOptions options;
  options.accelerator = s.accelerator.name();
  options.devices = 1;
  options.precision = precision;
  options.max_epochs = 1;
  options.num_sanity_val_steps = 0;
  options.default_root_dir = root;
  options.callbacks = {timer};
  if (!defaults) {
    options.enable_progress_bar = false;
    options.logger = false;
    options.enable_checkpointing = false;
    options.enable_model_summary = false;
  }
  SilentStdout quiet;
  Trainer trainer(options);
  trainer.fit(model, loader);
  return timer->result;
}

void device_model_rows(Report& report, const Settings& settings, const Accelerator& accelerator,
                       const DeviceModel& spec) {
  const torch::Device device = accelerator.parse_devices(1).front();
  const Run run = settings.quick ? Run{2, 8} : Run{50, spec.name.rfind("mlp 4096", 0) == 0 ? 200 : 550};
  // One epoch of distinct batches, made on the device (several GB for the
  // 100M model) and copied to host memory, pinned where the device can copy
  // from it asynchronously.
  std::vector<int64_t> shape{spec.batch * run.steps};
  shape.insert(shape.end(), spec.input_shape.begin(), spec.input_shape.end());
  torch::manual_seed(0);
  const auto host = torch::TensorOptions().pinned_memory(accelerator.supports_pinned_memory());
  torch::Tensor data = torch::empty(shape, host), targets = torch::empty({shape[0]}, host.dtype(torch::kLong));
  data.copy_(torch::randn(shape, torch::TensorOptions().device(device)));
  targets.copy_(torch::randint(10, {shape[0]}, torch::TensorOptions().dtype(torch::kLong).device(device)));
  torch::manual_seed(1);
  const Setup s{accelerator, device, data, targets, spec.batch, spec.make(), run, has_fused_kernel(device)};
  const auto root = (std::filesystem::temp_directory_path() / "fulgor-gpu-benchmark").string();
  const std::string fused_name = s.fused_kernel ? "fulgor bare, fused Adam" : "fulgor bare, foreach Adam";
  for (const std::string& precision : spec.precisions) {
    std::vector<std::string> names{"hand-written LibTorch", "fulgor bare", "fulgor defaults", fused_name};
    std::vector<double> rates(names.size());
    std::vector<std::function<void()>> variants{
        [&] { rates[0] = hand_written(s, precision); },
        [&] { rates[1] = through_fulgor(s, precision, false, std::nullopt, root); },
        [&] { rates[2] = through_fulgor(s, precision, true, std::nullopt, root); },
        [&] { rates[3] = through_fulgor(s, precision, false, fused_or_foreach(s.fused_kernel), root); }};
    // Each variant's steps per second, repeat by repeat (the harness times
    // whole runs, set-up included; the rates are the runs' own).
    std::vector<std::vector<double>> per_variant(names.size());
    std::vector<std::function<void()>> recorded;
    for (size_t i = 0; i < variants.size(); ++i)
      recorded.push_back([&, i] {
        variants[i]();
        per_variant[i].push_back(rates[i]);
      });
    interleaved_times(recorded, settings.gpu_repeats);
    std::filesystem::remove_all(root);
    const double hand = median(std::vector<double>(per_variant[0].end() - settings.gpu_repeats, per_variant[0].end()));
    for (size_t i = 0; i < names.size(); ++i) {
      // The warm-up round's rate is left out.
      std::vector<double> timed(per_variant[i].end() - settings.gpu_repeats, per_variant[i].end());
      const double m = median(timed);
      const auto [low, high] = std::minmax_element(timed.begin(), timed.end());
      report.row({"gpu", fmt::format("{} on {}, {}, {}", spec.name, device.str(), precision, names[i]),
                  fmt::format("{:.1f} steps/s [{:.1f}, {:.1f}]", m, *low, *high),
                  i == 0 ? "" : fmt::format("{:.3f}x", m / hand)});
    }
  }
}

}  // namespace

void gpu_benchmark(Report& report, const Settings& settings) {
  auto accelerator = make_accelerator(settings.device);
  if (!accelerator->is_available()) {
    report.row({"gpu", settings.device + " is not available: " + accelerator->availability().reason, "", ""});
    return;
  }
  for (const DeviceModel& spec : device_models(settings.quick)) device_model_rows(report, settings, *accelerator, spec);
}

}  // namespace fulgor::bench
