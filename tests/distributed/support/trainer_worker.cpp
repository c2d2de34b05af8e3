// The program the ddp Trainer tests start as every rank (through fulgor-run,
// or directly with the launch variables set):
//
//   fulgor_ddp_trainer_worker fit OUTDIR EPOCHS ACCUMULATE
//   fulgor_ddp_trainer_worker manual OUTDIR EPOCHS 1
//   fulgor_ddp_trainer_worker resume OUTDIR EPOCHS ACCUMULATE
//   fulgor_ddp_trainer_worker die OUTDIR kill|stop
//   fulgor_ddp_trainer_worker disagree OUTDIR
//
// "fit" trains the shared model with strategy "ddp" for EPOCHS epochs;
// "manual" the same with the model optimizing manually.
// "resume" trains until the middle of the second epoch, saves a checkpoint there,
// and fits EPOCHS epochs from it with a new Trainer and a differently
// initialised model. "die" trains with a ddp_timeout of 10 s; rank 1 kills or
// stops itself at batch 2. "disagree" trains 3 epochs with a ddp_timeout of
// 10 s, both ranks in OUTDIR, keeping the best checkpoint by a metric the
// ranks log unsynchronized (RegressionNet::log_disagreeing) in
// OUTDIR/checkpoints. Otherwise each rank works in OUTDIR/rankR and writes its
// final parameters, the gradients it held after each backward pass and its
// metrics to OUTDIR. Exits 0 on success, 3 with the message on a
// fulgor::Error, 4 on any other exception.

#include <torch/torch.h>

#include <csignal>
#include <fstream>
#include <iostream>
#include <string>

#include "ddp_trainer_scenario.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/error.h"

namespace {

using namespace fulgor::test;

void write_results(const std::string& out, int64_t rank, fulgor::Trainer& trainer, RegressionNet& model) {
  torch::serialize::OutputArchive archive;
  archive.write("final", flat_parameters(model));
  archive.write("gradients", torch::stack(model.gradients));
  archive.save_to(out + "/params_rank" + std::to_string(rank) + ".pt");
  std::ofstream metrics(out + "/metrics_rank" + std::to_string(rank) + ".txt");
  metrics.precision(17);
  metrics << "global_rank " << trainer.global_rank() << "\nworld_size " << trainer.world_size() << "\nis_global_zero "
          << trainer.is_global_zero() << "\n";
  for (const auto& [name, value] : trainer.callback_metrics()) metrics << name << " " << value << "\n";
}

// Saves a checkpoint at the batch that takes the run to `step`, inside the
// epoch: one saved after fit would resume at the next epoch, since the epoch a
// stop cuts short counts as done (Lightning's rule).
class SaveAtStep final : public fulgor::Callback {
 public:
  SaveAtStep(int64_t step, std::string path) : step_(step), path_(std::move(path)) {}
  void on_train_batch_end(fulgor::Trainer& trainer, fulgor::ModuleBase&, const torch::Tensor&, int64_t) override {
    if (trainer.global_step() == step_) trainer.save_checkpoint(path_);
  }

 private:
  int64_t step_;
  std::string path_;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t rank = 0;
  try {
    torch::set_num_threads(1);
    const auto env = fulgor::detect_distributed_environment();
    rank = env.rank;
    const std::string mode = argc > 1 ? argv[1] : "";
    if (!((mode == "fit" || mode == "manual" || mode == "resume") && argc == 5) && !(mode == "die" && argc == 4) &&
        !(mode == "disagree" && argc == 3)) {
      std::cerr << "usage: fulgor_ddp_trainer_worker fit|manual|resume OUTDIR EPOCHS ACCUMULATE\n"
                   "       fulgor_ddp_trainer_worker die OUTDIR kill|stop\n"
                   "       fulgor_ddp_trainer_worker disagree OUTDIR\n";
      return 2;
    }
    const std::string out = argv[2];
    const std::string root = out + "/rank" + std::to_string(rank);
    auto loader = make_loader(env.world_size, env.rank);
    if (mode == "die") {
      RegressionNet model(init_seed(env.rank));
      model.die_signal = std::string(argv[3]) == "kill" ? SIGKILL : SIGSTOP;
      auto options = ddp_options(root, 2, 1);
      options.ddp_timeout = 10.0;
      fulgor::Trainer trainer(options);
      trainer.fit(model, loader);
      std::cerr << "worker rank " << rank << ": the fit ended normally\n";
      return 0;
    }
    if (mode == "disagree") {
      RegressionNet model(init_seed(env.rank));
      model.log_disagreeing = true;
      auto options = ddp_options(out, 3, 1);
      options.ddp_timeout = 10.0;
      options.logger = false;
      fulgor::ModelCheckpointOptions best;
      best.dirpath = out + "/checkpoints";
      best.filename = "{epoch}";
      best.monitor = "disagreeing";
      options.callbacks = {std::make_shared<fulgor::ModelCheckpoint>(best)};
      fulgor::Trainer trainer(options);
      trainer.fit(model, loader);
      return 0;
    }
    const int64_t epochs = std::stoll(argv[3]), accumulate = std::stoll(argv[4]);
    if (mode == "fit" || mode == "manual") {
      RegressionNet model(init_seed(env.rank));
      model.set_automatic_optimization(mode == "fit");
      fulgor::Trainer trainer(ddp_options(root, epochs, accumulate));
      trainer.fit(model, loader);
      write_results(out, rank, trainer, model);
    } else {
      const std::string checkpoint = out + "/rank0/mid.ckpt";
      {
        RegressionNet model(init_seed(env.rank));
        auto options = ddp_options(root, epochs, accumulate);
        options.max_steps = (kStepsPerEpoch + kStepsPerEpoch / 2) / accumulate;
        options.callbacks = {std::make_shared<SaveAtStep>(options.max_steps, checkpoint)};
        fulgor::Trainer trainer(options);
        trainer.fit(model, loader);
      }
      RegressionNet model(init_seed(env.rank) + 1000);
      auto again = make_loader(env.world_size, env.rank);
      fulgor::Trainer trainer(ddp_options(root, epochs, accumulate));
      trainer.fit(model, again, fulgor::FitOptions{checkpoint});
      write_results(out, rank, trainer, model);
    }
  } catch (const fulgor::Error& e) {
    std::cerr << "worker rank " << rank << ": " << e.what() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "worker rank " << rank << ": unexpected " << e.what() << std::endl;
    return 4;
  }
  return 0;
}
