// The program the ddp Trainer tests start as every rank through fulgor-run:
//
//   fulgor_ddp_trainer_worker fit OUTDIR EPOCHS ACCUMULATE
//   fulgor_ddp_trainer_worker resume OUTDIR EPOCHS ACCUMULATE
//
// "fit" trains the shared model with strategy "ddp" for EPOCHS epochs; "resume"
// trains one epoch, saves a checkpoint, and fits EPOCHS epochs from it with a
// new Trainer and a differently initialised model. Each rank works in
// OUTDIR/rankR and writes its final parameters and metrics to OUTDIR. Exits 0
// on success, 3 with the message on a fulgor::Error, 4 on any other exception.

#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <string>

#include "ddp_trainer_scenario.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/error.h"

namespace {

using namespace fulgor::test;

void write_results(const std::string& out, int64_t rank, fulgor::Trainer& trainer, torch::nn::Module& model) {
  torch::serialize::OutputArchive archive;
  archive.write("final", flat_parameters(model));
  archive.save_to(out + "/params_rank" + std::to_string(rank) + ".pt");
  std::ofstream metrics(out + "/metrics_rank" + std::to_string(rank) + ".txt");
  metrics.precision(17);
  metrics << "global_rank " << trainer.global_rank() << "\nworld_size " << trainer.world_size()
          << "\nis_global_zero " << trainer.is_global_zero() << "\n";
  for (const auto& [name, value] : trainer.callback_metrics()) metrics << name << " " << value << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rank = 0;
  try {
    torch::set_num_threads(1);
    const auto env = fulgor::detect_distributed_environment();
    rank = env.rank;
    if (argc != 5) {
      std::cerr << "usage: fulgor_ddp_trainer_worker fit|resume OUTDIR EPOCHS ACCUMULATE\n";
      return 2;
    }
    const std::string mode = argv[1], out = argv[2];
    const int64_t epochs = std::stoll(argv[3]), accumulate = std::stoll(argv[4]);
    const std::string root = out + "/rank" + std::to_string(rank);
    auto loader = make_loader(env.world_size, env.rank);
    if (mode == "fit") {
      RegressionNet model(init_seed(env.rank));
      fulgor::Trainer trainer(ddp_options(root, epochs, accumulate));
      trainer.fit(model, loader);
      write_results(out, rank, trainer, model);
    } else if (mode == "resume") {
      {
        RegressionNet model(init_seed(env.rank));
        fulgor::Trainer trainer(ddp_options(root, 1, accumulate));
        trainer.fit(model, loader);
        trainer.save_checkpoint(out + "/rank0/mid.ckpt");
      }
      RegressionNet model(init_seed(env.rank) + 1000);
      auto again = make_loader(env.world_size, env.rank);
      fulgor::Trainer trainer(ddp_options(root, epochs, accumulate));
      trainer.fit(model, again, {out + "/rank0/mid.ckpt"});
      write_results(out, rank, trainer, model);
    } else {
      std::cerr << "unknown mode " << mode << "\n";
      return 2;
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
