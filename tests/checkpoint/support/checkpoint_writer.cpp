// The program the checkpoint crash test starts and kills:
//
//   fulgor_checkpoint_writer ROOT MAX_STEPS [KILL_AT_STEP]
//
// Fits WriterModel in ROOT, saving a checkpoint after every step (the three
// lowest train_loss and last.ckpt, in ROOT/checkpoints) until MAX_STEPS,
// always with ckpt_path "last", as a job that is restarted passes it: the
// first run finds no checkpoint and starts fresh. Prints "training from step
// N" once training has begun (after the resume). Exits 0 on success, 3 with
// the message on a fulgor::Error, 4 on any other exception. Saves
// synchronously, the Trainer's default, unless KILL_AT_STEP is given: then
// asynchronously, and from that step on it kills itself with SIGKILL once it
// sees the background write of last.ckpt under way (its temporary file
// created), after printing "killed at step N".

#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include "fulgor/fulgor.h"
#include "writer_model.h"

namespace {

namespace fs = std::filesystem;

struct AnnounceTraining final : fulgor::Callback {
  void on_train_start(fulgor::Trainer& trainer, fulgor::ModuleBase&) override {
    std::cout << "training from step " << trainer.global_step() << std::endl;
  }
};

// Kills the process while the write of last.ckpt is in flight: at the first
// step from `from` on whose write it sees under way (a fast disk may finish
// a write before it looks). The write goes on between the look and the kill,
// so it may complete in between (the rename is all that is left by then).
struct KillDuringWrite final : fulgor::Callback {
  int64_t from;
  explicit KillDuringWrite(int64_t step) : from(step) {}
  // Ordered after the ModelCheckpoint, as checkpointing callbacks are: its
  // saves of the step have begun.
  bool saves_checkpoints() const override { return true; }
  void on_train_batch_end(fulgor::Trainer& trainer, fulgor::ModuleBase&, const torch::Tensor&, int64_t) override {
    if (trainer.global_step() < from) return;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (std::chrono::steady_clock::now() < give_up) {
      std::error_code ec;
      for (auto it = fs::directory_iterator(trainer.checkpoint_dir(), ec); !ec && it != fs::directory_iterator();
           it.increment(ec))
        if (it->path().filename().string().rfind(".last.ckpt.tmp.", 0) == 0) {
          std::cout << "killed at step " << trainer.global_step() << std::endl;
          std::raise(SIGKILL);
        }
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::cerr << "usage: fulgor_checkpoint_writer ROOT MAX_STEPS [KILL_AT_STEP]\n";
    return 2;
  }
  try {
    torch::set_num_threads(1);
    const std::string root = argv[1];
    torch::manual_seed(3);
    fulgor::TensorLoaderOptions shuffled;
    shuffled.batch_size = 8;
    shuffled.shuffle = true;
    fulgor::TensorLoader loader(torch::randn({64, 256}), torch::randn({64, 256}), shuffled);
    fulgor::testing::WriterModel model;

    fulgor::ModelCheckpointOptions every_step;
    every_step.filename = "{step}";
    every_step.monitor = "train_loss";
    every_step.save_top_k = 3;
    every_step.save_last = true;
    every_step.every_n_train_steps = 1;
    fulgor::TrainerOptions options;
    options.accelerator = "cpu";
    options.devices = 1;
    options.default_root_dir = root;
    options.logger = false;
    options.enable_progress_bar = false;
    options.enable_model_summary = false;
    options.max_steps = std::stoll(argv[2]);
    options.callbacks = {std::make_shared<fulgor::ModelCheckpoint>(every_step), std::make_shared<AnnounceTraining>()};
    if (argc == 4) {
      options.async_checkpointing = true;
      options.callbacks.push_back(std::make_shared<KillDuringWrite>(std::stoll(argv[3])));
    }
    fulgor::Trainer trainer(options);
    trainer.fit(model, loader, fulgor::FitOptions{"last"});
  } catch (const fulgor::Error& e) {
    std::cerr << "fulgor_checkpoint_writer: " << e.what() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "fulgor_checkpoint_writer: unexpected " << e.what() << std::endl;
    return 4;
  }
  return 0;
}
