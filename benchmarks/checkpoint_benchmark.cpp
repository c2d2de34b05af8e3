// Saving and loading a 10-million-parameter model: a Trainer checkpoint (model,
// optimizer state, loop state, RNG states; written atomically) against
// torch::save + fsync / torch::load of the module alone; the training
// thread's stall per asynchronous save of a 100 MB model against a
// synchronous save, as one file and as a sharded checkpoint's folder
// (state_dict_type "sharded", one process); and the steps per second of a fit of that model saving
// every N steps against the same fit without checkpoints.

#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "benchmarks.h"
#include "fulgor/callbacks/model_checkpoint.h"
#include "fulgor/checkpoint/checkpoint.h"
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

// torch::save made durable, as a checkpoint that survives a crash must be.
void save_and_fsync(const std::shared_ptr<torch::nn::Module>& module, const std::string& path) {
  torch::save(module, path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

TensorLoader wide_loader(int64_t width) {
  TensorLoaderOptions loader_options;
  loader_options.batch_size = 2;
  return TensorLoader(torch::randn({2, width}), torch::randn({2, width}), loader_options);
}

// A quiet Trainer on the CPU writing under `dir`, without checkpoints.
TrainerOptions quiet_options(const std::filesystem::path& dir) {
  TrainerOptions options;
  options.accelerator = "cpu";
  options.devices = 1;
  options.enable_progress_bar = false;
  options.enable_model_summary = false;
  options.enable_checkpointing = false;
  options.logger = false;
  options.default_root_dir = dir.string();
  return options;
}

std::unique_ptr<Trainer> fitted_trainer(Wide& model, TensorLoader& loader, const std::filesystem::path& dir,
                                        const std::string& state_dict_type = "full") {
  TrainerOptions options = quiet_options(dir);
  options.max_epochs = 1;
  options.state_dict_type = state_dict_type;
  // For async_stall's save_checkpoint_async; save_checkpoint is synchronous either way.
  options.async_checkpointing = true;
  auto trainer = std::make_unique<Trainer>(options);
  trainer->fit(model, loader);
  return trainer;
}

// The training thread's time in an asynchronous save (the copy to host
// memory), its write waited for outside the timing, against a synchronous
// save, with `state_dict_type`.
void async_stall(Report& report, const Settings& settings, const std::filesystem::path& dir,
                 const std::string& state_dict_type) {
  const int64_t width = settings.quick ? 1000 : 5000;  // 25.0 million parameters, 100 MB
  Wide model(width);
  TensorLoader loader = wide_loader(width);
  const auto fitted = fitted_trainer(model, loader, dir, state_dict_type);
  Trainer& trainer = *fitted;
  const std::string path = (dir / ("async_" + state_dict_type + ".ckpt")).string();
  using Clock = std::chrono::steady_clock;
  std::vector<double> stall, sync;
  for (int r = 0; r < settings.repeats; ++r) {
    auto start = Clock::now();
    trainer.save_checkpoint_async(path);
    stall.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    trainer.wait_for_checkpoint();
    start = Clock::now();
    trainer.save_checkpoint(path);
    sync.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  const double stall_s = median(stall), sync_s = median(sync);
  const bool sharded = state_dict_type == "sharded";
  report.row({"checkpoint",
              fmt::format("asynchronous {}save, {:.1f}M parameters, training thread", sharded ? "sharded " : "",
                          width * width / 1e6),
              fmt::format("{:.0f} ms (synchronous {:.0f} ms)", stall_s * 1e3, sync_s * 1e3),
              fmt::format("{:.1f}% of a synchronous save", 100 * stall_s / sync_s)});
  report.figures[sharded ? "checkpoint_sharded_async_stall_ratio" : "checkpoint_async_stall_ratio"] = stall_s / sync_s;
}

// A fit of `steps` steps that saves every `every` steps (none if 0), in a
// folder of its own as a new run has; its time in seconds.
double fit_saving_every(int64_t width, int64_t steps, int64_t every, bool async, const std::filesystem::path& dir) {
  torch::manual_seed(0);
  Wide model(width);
  TensorLoader loader = wide_loader(width);
  TrainerOptions options = quiet_options(dir);
  options.max_steps = steps;
  options.enable_checkpointing = every > 0;
  options.async_checkpointing = async;
  if (every > 0) {
    ModelCheckpointOptions checkpoints;
    checkpoints.every_n_train_steps = every;
    options.callbacks = {std::make_shared<ModelCheckpoint>(checkpoints)};
  }
  Trainer trainer(options);
  const auto start = std::chrono::steady_clock::now();
  trainer.fit(model, loader);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::filesystem::remove_all(dir);
  return seconds;
}

// Steps per second of fits of the 100 MB model that save every N steps
// (the last save N/2 steps before the end, as a run's last save seldom falls
// on its last step), asynchronously and synchronously, against the same
// fits without checkpoints, run interleaved.
void saving_every_n_steps(Report& report, const Settings& settings, const std::filesystem::path& dir) {
  const int64_t width = settings.quick ? 1000 : 5000, every = 20, steps = 3 * every + every / 2;
  // Interleaved, and only fit() timed: building the model takes longer than some fits.
  std::vector<std::vector<double>> seconds(3);
  for (int r = 0, run = 0; r < std::max(3, settings.repeats / 2); ++r)
    for (int v = 0; v < 3; ++v)
      seconds[v].push_back(
          fit_saving_every(width, steps, v == 0 ? 0 : every, v == 1, dir / ("run-" + std::to_string(run++))));
  const std::vector<double> times = {median(seconds[0]), median(seconds[1]), median(seconds[2])};
  const double none = steps / times[0], async = steps / times[1], sync = steps / times[2];
  const std::string what =
      fmt::format("{:.1f}M parameters, {} steps, a save every {}", width * width / 1e6, steps, every);
  report.row({"checkpoint", "fit without checkpoints, " + what, fmt::format("{:.1f} steps/s", none), ""});
  report.row({"checkpoint", "fit saving asynchronously", fmt::format("{:.1f} steps/s", async),
              fmt::format("{:.3f}x the steps/s", async / none)});
  report.row({"checkpoint", "fit saving synchronously", fmt::format("{:.1f} steps/s", sync),
              fmt::format("{:.3f}x the steps/s", sync / none)});
  report.figures["checkpoint_every_n_steps_async_ratio"] = async / none;
  report.figures["checkpoint_every_n_steps_sync_ratio"] = sync / none;
}

}  // namespace

void checkpoint_benchmark(Report& report, const Settings& settings) {
  const int64_t width = settings.quick ? 1000 : 3162;  // 3162^2 + 3162 = 10.0 million parameters
  const auto dir = std::filesystem::temp_directory_path() / "fulgor-checkpoint-benchmark";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Wide model(width);
  TensorLoader loader = wide_loader(width);
  const auto fitted = fitted_trainer(model, loader, dir);
  Trainer& trainer = *fitted;

  const std::string fulgor_path = (dir / "fulgor.ckpt").string(), raw_path = (dir / "raw.pt").string();
  std::shared_ptr<torch::nn::Module> as_module(&model, [](torch::nn::Module*) {});
  auto save = interleaved_medians(
      {[&] { save_and_fsync(as_module, raw_path); }, [&] { trainer.save_checkpoint(fulgor_path); }}, settings.repeats);
  auto load = interleaved_medians(
      {[&] { torch::load(as_module, raw_path); }, [&] { load_module_weights(model, fulgor_path); }}, settings.repeats);
  const auto raw_bytes = std::filesystem::file_size(raw_path), fulgor_bytes = std::filesystem::file_size(fulgor_path);
  const int64_t parameters = width * width + width;
  report.row({"checkpoint", fmt::format("torch::save + fsync, {:.1f}M parameters", parameters / 1e6),
              fmt::format("{:.0f} ms, {:.1f} MB", save[0] * 1e3, raw_bytes / 1e6), ""});
  report.row({"checkpoint", "Trainer::save_checkpoint (+ optimizer, loop, RNG)",
              fmt::format("{:.0f} ms, {:.1f} MB", save[1] * 1e3, fulgor_bytes / 1e6),
              fmt::format("{:.2f}x time", save[1] / save[0])});
  report.row({"checkpoint", "torch::load", fmt::format("{:.0f} ms", load[0] * 1e3), ""});
  report.row({"checkpoint", "fulgor::load_module_weights", fmt::format("{:.0f} ms", load[1] * 1e3),
              fmt::format("{:.2f}x time", load[1] / load[0])});
  report.figures["checkpoint_save_ratio"] = save[1] / save[0];
  report.figures["checkpoint_load_ratio"] = load[1] / load[0];
  async_stall(report, settings, dir, "full");
  async_stall(report, settings, dir, "sharded");
  saving_every_n_steps(report, settings, dir);
  std::filesystem::remove_all(dir);
  distributed_checkpoint_rows(report, settings);
}

}  // namespace fulgor::bench
