// The program the ddp Trainer tests start as every rank (through fulgor-run,
// or directly with the launch variables set):
//
//   fulgor_ddp_trainer_worker fit OUTDIR EPOCHS ACCUMULATE
//   fulgor_ddp_trainer_worker manual OUTDIR EPOCHS 1
//   fulgor_ddp_trainer_worker resume OUTDIR EPOCHS ACCUMULATE
//   fulgor_ddp_trainer_worker resume_last OUTDIR EPOCHS ACCUMULATE
//   fulgor_ddp_trainer_worker die OUTDIR kill|stop
//   fulgor_ddp_trainer_worker stop_once OUTDIR EPOCHS ACCUMULATE
//   fulgor_ddp_trainer_worker disagree OUTDIR
//   fulgor_ddp_trainer_worker shard OUTDIR on|off
//   fulgor_ddp_trainer_worker syncbn OUTDIR on|off
//
// "fit" trains the shared model with strategy "ddp" for EPOCHS epochs;
// "manual" the same with the model optimizing manually.
// "resume" trains until the middle of the second epoch, saves a checkpoint there,
// and fits EPOCHS epochs from it with a new Trainer and a differently
// initialised model. "resume_last" does the same with the checkpoint saved
// as last.ckpt in the checkpoint folder of each rank's own OUTDIR/rankR, where
// rank 0 alone writes, and the fit from ckpt_path "last": rank 1's folder
// holds none, so rank 1 resumes only by rank 0's choice. "die" trains with a ddp_timeout of 10 s; rank 1 kills or
// stops itself at batch 2. "stop_once" fits from ckpt_path "last" with a
// ddp_timeout of 5 s, saving last.ckpt at every epoch's end, and in its first
// start (TORCHELASTIC_RESTART_COUNT 0) rank 1 stops itself at batch 2 of the
// second epoch. "disagree" trains 3 epochs with a ddp_timeout of
// 10 s, both ranks in OUTDIR, keeping the best checkpoint by a metric the
// ranks log unsynchronized (RegressionNet::log_disagreeing) in
// OUTDIR/checkpoints. "shard" fits ShardNet 2 epochs on plain TensorLoaders
// (16 shuffled training samples, 7 validation samples in batches of 3) with
// use_distributed_sampler on or off, then validates once more, and writes the
// samples each rank trained on per epoch and its metrics to
// OUTDIR/shard_rankR.txt; it then predicts on the validation samples with a
// TorchSavePredictionWriter writing into OUTDIR/predictions. "syncbn" fits
// the shared model with a BatchNorm1d (make_batchnorm_model) 2 epochs with
// sync_batchnorm on or off, and also writes the layer's buffers, and whether
// the fit put the same BatchNorm back, to OUTDIR/syncbn_rankR.pt.
// Otherwise each rank works in OUTDIR/rankR and writes its
// final parameters, the gradients it held after each backward pass and its
// metrics to OUTDIR. Exits 0 on success, 3 with the message on a
// fulgor::Error, 4 on any other exception.

#include <torch/torch.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "ddp_trainer_scenario.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/core/error.h"
#include "worker_main.h"

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

// Sample i of either data set has data [i] and target i. Training records
// the samples each epoch brings; validation logs, over its samples, the mean
// of i^2 (sync_dist), their count (sync_dist, summed; and unsynced), the
// largest i (sync_dist) and a binary Accuracy of the prediction (i % 3 == 0)
// against the target i % 2.
struct ShardNet : fulgor::Module {
  torch::nn::Linear lin{nullptr};
  std::map<int64_t, std::vector<int64_t>> trained_on;
  fulgor::metrics::Accuracy accuracy;

  ShardNet() { lin = register_module("lin", torch::nn::Linear(1, 1)); }

  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    auto& seen = trained_on[trainer().current_epoch()];
    for (int64_t i = 0; i < batch.target.size(0); ++i) seen.push_back(batch.target[i].item<int64_t>());
    return torch::mse_loss(lin->forward(batch.data), batch.data * 0.5);
  }
  // Ten times the sample's id, which the prediction files are checked against.
  torch::Tensor predict_step(torch::data::Example<> batch, int64_t) override {
    return batch.target.to(torch::kFloat) * 10;
  }
  void validation_step(torch::data::Example<> batch, int64_t) override {
    const torch::Tensor ids = batch.target;
    fulgor::LogOptions synced;
    synced.sync_dist = true;
    log("val_square", ids.to(torch::kDouble).pow(2).mean(), synced);
    fulgor::LogOptions summed = synced;
    summed.reduce = fulgor::Reduce::sum;
    log("val_count", static_cast<double>(ids.size(0)), summed);
    fulgor::LogOptions largest = synced;
    largest.reduce = fulgor::Reduce::max;
    log("val_max", ids.max().to(torch::kDouble), largest);
    fulgor::LogOptions local;
    local.reduce = fulgor::Reduce::sum;
    log("val_local_count", static_cast<double>(ids.size(0)), local);
    accuracy.update(ids.remainder(3).eq(0).to(torch::kFloat), ids.remainder(2));
    log("val_acc", accuracy);
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01));
  }
};

fulgor::TensorLoader id_loader(int64_t n, int64_t batch_size, bool shuffle) {
  const torch::Tensor ids = torch::arange(n, torch::kLong);
  fulgor::TensorLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = shuffle;
  options.seed = 3;
  return fulgor::TensorLoader(ids.unsqueeze(1).to(torch::kFloat), ids, options);
}

void shard(const std::string& out, int64_t rank, bool use_distributed_sampler) {
  ShardNet model;
  auto train = id_loader(16, 4, true);
  auto val = id_loader(7, 3, false);
  auto options = ddp_options(out + "/rank" + std::to_string(rank), 2, 1);
  options.logger = false;
  options.enable_checkpointing = false;
  options.use_distributed_sampler = use_distributed_sampler;
  options.callbacks = {std::make_shared<fulgor::TorchSavePredictionWriter>(out + "/predictions", "batch_and_epoch")};
  fulgor::Trainer trainer(options);
  trainer.fit(model, train, val);
  std::ofstream file(out + "/shard_rank" + std::to_string(rank) + ".txt");
  file.precision(17);
  for (const auto& [epoch, ids] : model.trained_on) {
    file << "train" << epoch;
    for (int64_t id : ids) file << " " << id;
    file << "\n";
  }
  file << "train_batches " << train.size() << "\nval_batches " << val.size() << "\n";
  for (const auto& [name, value] : trainer.callback_metrics()) file << "fit_" << name << " " << value << "\n";
  for (const auto& [name, value] : trainer.validate(model, val)) file << "validate_" << name << " " << value << "\n";
  trainer.predict(model, val);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rank = 0;
  return fulgor::test::run_worker(rank, [&] {
    torch::set_num_threads(1);
    const auto env = fulgor::detect_distributed_environment();
    rank = env.rank;
    const std::string mode = argc > 1 ? argv[1] : "";
    if (!((mode == "fit" || mode == "manual" || mode == "resume" || mode == "resume_last" || mode == "stop_once") &&
          argc == 5) &&
        !(mode == "die" && argc == 4) && !(mode == "disagree" && argc == 3) &&
        !((mode == "shard" || mode == "syncbn") && argc == 4)) {
      std::cerr << "usage: fulgor_ddp_trainer_worker fit|manual|resume|resume_last|stop_once OUTDIR EPOCHS "
                   "ACCUMULATE\n"
                   "       fulgor_ddp_trainer_worker die OUTDIR kill|stop\n"
                   "       fulgor_ddp_trainer_worker disagree OUTDIR\n"
                   "       fulgor_ddp_trainer_worker shard OUTDIR on|off\n"
                   "       fulgor_ddp_trainer_worker syncbn OUTDIR on|off\n";
      return 2;
    }
    const std::string out = argv[2];
    const std::string root = out + "/rank" + std::to_string(rank);
    if (mode == "shard") {
      shard(out, rank, std::string(argv[3]) == "on");
      return 0;
    }
    auto loader = make_loader(env.world_size, env.rank);
    if (mode == "syncbn") {
      RegressionNet model(make_batchnorm_model(init_seed(env.rank)));
      // Not a shared_ptr: a BatchNorm held outside the module tree is refused.
      const torch::nn::Module* layer = model.net->ptr(1).get();
      auto options = ddp_options(root, 2, 1);
      options.sync_batchnorm = std::string(argv[3]) == "on";
      fulgor::Trainer trainer(options);
      trainer.fit(model, loader);
      write_results(out, rank, trainer, model);
      auto& bn = *std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(model.net->ptr(1));
      torch::serialize::OutputArchive archive;
      archive.write("running_mean", bn.running_mean);
      archive.write("running_var", bn.running_var);
      archive.write("num_batches_tracked", bn.num_batches_tracked);
      const bool same_layer = model.net->ptr(1).get() == layer && model.net->named_children()["1"].get() == layer;
      archive.write("same_layer", torch::tensor(same_layer));
      archive.save_to(out + "/syncbn_rank" + std::to_string(rank) + ".pt");
      return 0;
    }
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
    if (mode == "stop_once") {
      RegressionNet model(init_seed(env.rank));
      const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
      if (restart && std::string(restart) == "0") {
        model.die_signal = SIGSTOP;
        model.die_in_epoch = 1;
      }
      auto options = ddp_options(root, epochs, accumulate);
      options.ddp_timeout = 5.0;
      fulgor::ModelCheckpointOptions last;
      last.dirpath = root + "/checkpoints";
      last.save_last = true;
      options.callbacks = {std::make_shared<fulgor::ModelCheckpoint>(last)};
      fulgor::Trainer trainer(options);
      trainer.fit(model, loader, fulgor::FitOptions{"last"});
      write_results(out, rank, trainer, model);
    } else if (mode == "fit" || mode == "manual") {
      RegressionNet model(init_seed(env.rank));
      model.set_automatic_optimization(mode == "fit");
      fulgor::Trainer trainer(ddp_options(root, epochs, accumulate));
      trainer.fit(model, loader);
      write_results(out, rank, trainer, model);
    } else {
      const bool last = mode == "resume_last";
      const std::string checkpoint = last ? root + "/checkpoints/last.ckpt" : out + "/rank0/mid.ckpt";
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
      trainer.fit(model, again, fulgor::FitOptions{last ? "last" : checkpoint});
      write_results(out, rank, trainer, model);
    }
    return 0;
  });
}
