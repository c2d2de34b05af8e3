// The program the tests of the Trainer's own launcher run (Note [The
// Trainer's own launcher]), once, without a launcher:
//
//   fulgor_self_launch_worker fit|kill|throw|sigterm|restart OUTDIR
//
// It registers "twodevices", a CPU-backed accelerator with two devices and a
// priority above the built-ins, which records in OUTDIR/setup_rankR.txt what
// setup_device is told, and fits a small regression with a Trainer at its
// defaults: "auto" picks twodevices, whose two devices make the Trainer start
// rank 1. Each rank writes OUTDIR/rankR.txt (its pid, its parent's pid, the
// checkpoint saved on a signal, its TORCHELASTIC_RESTART_COUNT, the training
// steps it ran and, last, the fit's stop message); rank 0 alone
// prints "summary" at the end. "kill": rank 1 kills itself with SIGKILL at its
// third batch; "throw": rank 1 throws from its third training step;
// "sigterm": trains until stopped, rank 0 writing OUTDIR/training once it is
// under way; "restart": fits from ckpt_path "last", and rank 1 kills itself
// with SIGKILL at the third batch of the second epoch when
// TORCHELASTIC_RESTART_COUNT is 0. Exits 0 on success, 3 with the message on
// a fulgor::Error, 4 on any other exception.

#include <fulgor/fulgor.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

namespace {

std::string g_mode;
std::string g_out;
int64_t g_steps = 0;  // training steps run by this process

int64_t rank_from_environment() {
  const char* rank = std::getenv("RANK");
  return rank ? std::atoll(rank) : 0;
}

std::string restart_count() {
  const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return count ? count : "none";
}

class TwoDevices final : public fulgor::Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "two CPU-backed devices that record their setup"; }
  int priority() const override { return 450; }
  fulgor::Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 2; }
  std::string distributed_backend() const override { return "gloo"; }

  void setup_device(const fulgor::DeviceSetup& setup) override {
    std::ofstream(g_out + "/setup_rank" + std::to_string(setup.rank) + ".txt", std::ios::app)
        << "index " << setup.index << " local_rank " << setup.local_rank << " local_world_size "
        << setup.local_world_size << " rank " << setup.rank << " world_size " << setup.world_size << " pid " << getpid()
        << "\n";
  }
};

struct Regression : fulgor::Module {
  torch::nn::Linear lin{nullptr};
  Regression() { lin = register_module("lin", torch::nn::Linear(4, 1)); }

  torch::Tensor training_step(torch::data::Example<> batch, int64_t index) override {
    ++g_steps;
    // 16 steps an epoch: 256 samples, 8 a batch, half to each rank.
    if (g_mode == "restart" && rank_from_environment() == 1 && restart_count() == "0" && g_steps == 16 + 3)
      raise(SIGKILL);
    if (rank_from_environment() == 1 && index == 2) {
      if (g_mode == "kill") raise(SIGKILL);
      if (g_mode == "throw") throw std::runtime_error("rank 1 fails on purpose");
    }
    if (g_mode == "sigterm") {
      if (index == 3 && rank_from_environment() == 0) std::ofstream(g_out + "/training") << "yes\n";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return torch::mse_loss(lin->forward(batch.data), batch.target);
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01));
  }
};

}  // namespace

REGISTER_ACCELERATOR("twodevices", TwoDevices);

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fulgor_self_launch_worker fit|kill|throw|sigterm|restart OUTDIR\n";
    return 2;
  }
  g_mode = argv[1];
  g_out = argv[2];
  try {
    torch::manual_seed(0);
    auto data = fulgor::TensorLoader(torch::randn({256, 4}), torch::randn({256, 1}), {.batch_size = 8});
    Regression model;
    fulgor::TrainerOptions options;
    options.max_epochs = g_mode == "sigterm" ? 1000 : 2;
    options.default_root_dir = g_out;
    options.enable_progress_bar = false;
    fulgor::Trainer trainer(options);
    const auto result = trainer.fit(model, data, {.ckpt_path = g_mode == "restart" ? "last" : ""});
    const int64_t rank = trainer.global_rank();
    std::ofstream(g_out + "/rank" + std::to_string(rank) + ".txt")
        << "pid " << getpid() << "\nparent " << getppid() << "\nworld_size " << trainer.world_size() << "\ncheckpoint "
        << (result.checkpoint_path.empty() ? "none" : result.checkpoint_path) << "\nrestart_count " << restart_count()
        << "\nsteps " << g_steps << "\nmessage " << result.message << "\n";
    if (trainer.is_global_zero()) std::cout << "summary " << result.global_step << std::endl;
    return 0;
  } catch (const fulgor::Error& e) {
    std::cerr << "fulgor_self_launch_worker: " << e.what() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "fulgor_self_launch_worker: " << e.what() << std::endl;
    return 4;
  }
}
