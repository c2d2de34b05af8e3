// The program the Fabric ddp tests start (through fulgor-run, or once, as a
// user runs a program, for Fabric to launch its ranks itself):
//
//   fulgor_fabric_worker fabric OUTDIR EPOCHS ACCUMULATE
//   fulgor_fabric_worker trainer OUTDIR EPOCHS ACCUMULATE
//   fulgor_fabric_worker adam OUTDIR EPOCHS LOAD
//   fulgor_fabric_worker plain_backward OUTDIR 1 1
//   fulgor_fabric_worker sharded OUTDIR VARIANT,... run|bare_step|optimizer_first
//
// Both train the distributed tests' regression network with SGD on two
// ranks of the CPU, each rank on its DistributedSampler shard of batches of
// 16: "fabric" in a hand-written loop with fulgor::Fabric, "trainer" with
// the Trainer's strategy "ddp". ACCUMULATE batches make one optimizer step.
// Each rank writes its final parameters to OUTDIR/MODE_rankR.pt, and "fabric"
// also what the collectives returned to OUTDIR/fabric_rankR.txt. "adam"
// trains with Adam, saves OUTDIR/epochE.ckpt after each epoch E and writes
// OUTDIR/adam_LOAD_rankR.pt; LOAD "none" starts afresh, "after_setup" and
// "before_setup" resume from OUTDIR/epoch1.ckpt, loaded after or before
// Fabric::setup, and "apart" loads epoch1.ckpt on rank 0 and epoch2.ckpt on
// rank 1. "plain_backward" calls loss.backward() where fabric.backward(loss)
// belongs. "sharded" trains, for each VARIANT in turn, a float64 network
// with Adam, clipping by norm and accumulating 2 batches: under ddp, zero1
// (ddp's zero_redundancy_optimizer), shard_grad_op (fsdp, SHARD_GRAD_OP) or
// full_shard (fsdp, FULL_SHARD: its first layer is a fulgor::Sharded unit,
// whose parameters must hold no memory after each step) or hybrid_shard
// (fsdp, HYBRID_SHARD, on the launcher's nodes), each rank one device;
// a VARIANT ending in "_resumed" saves OUTDIR/VARIANT.ckpt after its first
// epoch and trains the other epochs with a new Fabric, model and optimizer
// loaded from it (with "_dcp_resumed", a sharded checkpoint's folder:
// state_dict_type "sharded"); one ending in "_twice" synchronizes both passes of each
// step, whose gradients then add up; one ending in "_spike" trains under
// "16-mixed" with a loss whose gradient is infinite once, on rank 1, and
// checks that the loss scale backed off once. Every rank writes each variant's final parameters to
// OUTDIR/sharded_rankR.pt under the variant's name. "bare_step" steps the
// bare optimizer instead of the FabricOptimizer; "optimizer_first" only sets
// the optimizer up before the module. Exits 0 on success, 3 with
// the message on a fulgor::Error, 4 on any other exception.

#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "../../distributed/support/ddp_trainer_scenario.h"
#include "../../support/fp16_cpu.h"
#include "fulgor/core/error.h"
#include "fulgor/distributed/sharded_unit.h"
#include "fulgor/fabric/fabric.h"

namespace {

using namespace fulgor::test;

void write_parameters(const std::string& path, torch::nn::Module& module) {
  torch::serialize::OutputArchive archive;
  archive.write("final", flat_parameters(module));
  archive.save_to(path);
}

void run_fabric(const std::string& out, int64_t epochs, int64_t accumulate) {
  fulgor::Fabric fabric({.accelerator = "cpu", .devices = 2});
  fabric.launch();
  const std::string rank = std::to_string(fabric.global_rank());
  torch::nn::Sequential model = make_model(init_seed(fabric.global_rank()));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  auto optimizer = fabric.setup(model, sgd);
  // The loader shards itself already (a DistributedSampler of the user's).
  auto loader = fabric.setup_dataloaders(make_loader(fabric.world_size(), fabric.global_rank()));
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    int64_t batch_idx = 0;
    for (auto& batch : loader) {
      const bool steps = (batch_idx + 1) % accumulate == 0;
      if (batch_idx % accumulate == 0) optimizer.zero_grad();
      {
        auto no_sync = fabric.no_backward_sync(*model, /*enabled=*/!steps);
        torch::Tensor loss = torch::mse_loss(model->forward(batch.data), batch.target);
        fabric.backward(accumulate > 1 ? loss / static_cast<double>(accumulate) : loss);
      }
      if (steps) optimizer.step();
      ++batch_idx;
    }
  }
  write_parameters(out + "/fabric_rank" + rank + ".pt", *model);
  std::ofstream values(out + "/fabric_rank" + rank + ".txt");
  values.precision(17);
  const double mean = fabric.all_reduce(static_cast<double>(fabric.global_rank() + 1));
  const torch::Tensor gathered = fabric.all_gather(torch::full({2}, static_cast<double>(fabric.global_rank())));
  const torch::Tensor broadcast = fabric.broadcast(torch::full({1}, fabric.global_rank() + 5.0), 1);
  const nlohmann::json message = fabric.broadcast(nlohmann::json{{"from", fabric.global_rank()}});
  const double mine = static_cast<double>(fabric.global_rank() + 1);
  const auto nested = fabric.all_reduce(
      std::map<std::string, std::vector<torch::Tensor>>{{"x", {torch::full({1}, mine)}}}, fulgor::ReduceOp::sum);
  auto both = fabric.new_group({0, 1});
  auto alone = fabric.new_group({1});
  const double group_sum = fabric.all_reduce(mine, fulgor::ReduceOp::sum, &*both);
  const double alone_sum = alone ? fabric.all_reduce(mine, fulgor::ReduceOp::sum, &*alone) : 0;
  // Rank 1 runs after rank 0 has written its file.
  bool saw_first = false;
  fabric.rank_zero_first([&] {
    if (fabric.global_rank() == 0) std::ofstream(out + "/first").close();
    saw_first = std::ifstream(out + "/first").good();
  });
  fabric.barrier();
  values << "world_size " << fabric.world_size() << "\nglobal_rank " << fabric.global_rank() << "\nstrategy "
         << fabric.strategy() << "\nmean " << mean << "\ngathered_rows " << gathered.size(0) << "\ngathered_1 "
         << gathered[1][0].item<double>() << "\nbroadcast " << broadcast.item<double>() << "\nmessage_from "
         << message.at("from").get<int>() << "\nnested " << nested.at("x")[0].item<double>() << "\ngroup_sum "
         << group_sum << "\nalone " << alone.has_value() << "\nalone_sum " << alone_sum << "\nsaw_first " << saw_first
         << "\n";
}

// The resumable loop docs/ways_in.md describes: the epoch and the
// optimizer's state are saved with the model, and each epoch's order comes
// from the sampler's seed and set_epoch.
void run_adam(const std::string& out, int64_t epochs, const std::string& load) {
  fulgor::Fabric fabric({.accelerator = "cpu", .devices = 2});
  fabric.launch();
  const std::string rank = std::to_string(fabric.global_rank());
  torch::nn::Sequential model = make_model(init_seed(fabric.global_rank()));
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
  int64_t epoch = 0;
  const fulgor::FabricState state{{"model", model}, {"optimizer", adam}, {"epoch", epoch}};
  const std::string resume_from =
      load == "apart" && fabric.global_rank() == 1 ? out + "/epoch2.ckpt" : out + "/epoch1.ckpt";
  if (load == "before_setup") fabric.load(resume_from, state);
  auto optimizer = fabric.setup(model, adam);
  if (load == "after_setup" || load == "apart") fabric.load(resume_from, state);
  auto loader = fabric.setup_dataloaders(make_loader(fabric.world_size(), fabric.global_rank()));
  for (; epoch < epochs;) {
    loader.set_epoch(epoch);
    for (auto& batch : loader) {
      optimizer.zero_grad();
      fabric.backward(torch::mse_loss(model->forward(batch.data), batch.target));
      optimizer.step();
    }
    ++epoch;
    if (load == "none") fabric.save(out + "/epoch" + std::to_string(epoch) + ".ckpt", state);
  }
  write_parameters(out + "/adam_" + load + "_rank" + rank + ".pt", *model);
}

void run_plain_backward() {
  fulgor::Fabric fabric({.accelerator = "cpu", .devices = 2});
  fabric.launch();
  torch::nn::Sequential model = make_model(init_seed(fabric.global_rank()));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  auto optimizer = fabric.setup(model, sgd);
  for (auto& batch : fabric.setup_dataloaders(make_loader(fabric.world_size(), fabric.global_rank()))) {
    optimizer.zero_grad();
    torch::mse_loss(model->forward(batch.data), batch.target).backward();
    optimizer.step();
  }
}

constexpr int64_t kShardedEpochs = 3;

// One run of a "sharded" variant: from epoch `from` (after loading
// `resume_from` where not empty) to `until`, then saved to `save_to` where
// not empty.
struct ShardedRun {
  std::string strategy;
  int64_t from = 0, until = kShardedEpochs;
  std::string resume_from, save_to;
  bool bare_step = false;
  bool sync_every_pass = false;  // the accumulated passes synchronized too
  bool sharded_checkpoints = false;  // state_dict_type "sharded"
  bool spiked = false;               // precision "16-mixed", a spiked loss
};

// On the launcher's nodes, each rank one device.
fulgor::FabricOptions sharded_options(const std::string& strategy, bool sharded_checkpoints = false,
                                      bool spiked = false) {
  const auto env = fulgor::detect_distributed_environment();
  const bool fsdp = strategy == "shard_grad_op" || strategy == "full_shard" || strategy == "hybrid_shard";
  return {.accelerator = spiked ? "fp16_scaling_cpu" : "cpu",
          .devices = env.local_world_size,
          .precision = spiked ? "16-mixed" : "32-true",
          .strategy = fsdp ? "fsdp" : "ddp",
          .sharding_strategy = strategy == "full_shard"     ? "FULL_SHARD"
                               : strategy == "hybrid_shard" ? "HYBRID_SHARD"
                                                            : "SHARD_GRAD_OP",
          .zero_redundancy_optimizer = strategy == "zero1",
          .state_dict_type = sharded_checkpoints ? "sharded" : "full",
          .num_nodes = env.world_size / env.local_world_size};
}

torch::nn::Sequential sharded_model(int64_t rank) {
  torch::manual_seed(init_seed(rank));
  torch::nn::Sequential model(fulgor::Sharded(torch::nn::Linear(kFeatures, 5)), torch::nn::Tanh(),
                              torch::nn::Linear(5, 1));
  model->to(torch::kFloat64);
  return model;
}

// Lightning's order reversed: the optimizer set up before its module.
void set_up_optimizer_first(const std::string& strategy) {
  fulgor::Fabric fabric(sharded_options(strategy));
  fabric.launch();
  torch::nn::Sequential model = sharded_model(fabric.global_rank());
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.05));
  fabric.setup_optimizers(adam);
  fabric.setup_module(*model);
}

torch::Tensor train_sharded(const ShardedRun& run) {
  fulgor::Fabric fabric(sharded_options(run.strategy, run.sharded_checkpoints, run.spiked));
  fabric.launch();
  torch::nn::Sequential model = sharded_model(fabric.global_rank());
  // A parameter of one element that stays 0, whose gradient is infinite
  // under the loss scale at rank 1's second batch alone (a piece on rank 0
  // alone where the gradients are sharded).
  torch::Tensor spike = model->register_parameter("spike", torch::zeros({1}, torch::kFloat64));
  int64_t batches = 0;
  // As with Lightning's FSDP: the module first, then its optimizer.
  fabric.setup_module(*model);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.05).weight_decay(0.01));
  auto optimizer = fabric.setup_optimizers(adam);
  int64_t epoch = run.from;
  const fulgor::FabricState state{{"model", model}, {"optimizer", adam}, {"epoch", epoch}};
  if (!run.resume_from.empty()) fabric.load(run.resume_from, state);
  auto loader = fabric.setup_dataloaders(make_loader(fabric.world_size(), fabric.global_rank()));
  for (; epoch < run.until; ++epoch) {
    loader.set_epoch(epoch);
    int64_t batch_idx = 0;
    for (auto& batch : loader) {
      const bool steps = ++batch_idx % 2 == 0;
      {
        auto no_sync = fabric.no_backward_sync(*model, /*enabled=*/!steps && !run.sync_every_pass);
        auto autocast = fabric.autocast();
        const torch::Tensor prediction = model->forward(batch.data.to(torch::kFloat64));
        const double factor = run.spiked && fabric.global_rank() == 1 && batches++ == 1 ? fulgor::test::kSpike : 0.0;
        fabric.backward(torch::mse_loss(prediction, batch.target.to(torch::kFloat64)) / 2.0 + (spike * factor).sum());
      }
      if (!steps) continue;
      // The spike's infinite norm skips the step rather than stopping the run.
      fabric.clip_gradients(*model, optimizer, {.max_norm = 0.3, .error_if_nonfinite = !run.spiked});
      if (run.bare_step)
        optimizer->step();
      else
        optimizer.step();
      optimizer.zero_grad();
      if ((run.strategy == "full_shard" || run.strategy == "hybrid_shard") &&
          model->ptr(0)->parameters()[0].storage().nbytes() != 0)
        throw std::runtime_error("the unit's parameters hold memory between steps");
    }
  }
  if (!run.save_to.empty()) fabric.save(run.save_to, state);
  // Rank 1's infinite gradient skipped one step on every rank.
  if (run.spiked && fabric.grad_scaler()->get_scale() != fulgor::GradScalerOptions{}.init_scale / 2)
    throw std::runtime_error("the loss scale is " + std::to_string(fabric.grad_scaler()->get_scale()) +
                             ", not the initial one backed off once");
  torch::Tensor parameters;
  fabric.with_whole_parameters(*model, [&] { parameters = flat_parameters(*model); });
  return parameters;
}

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

void run_sharded(const std::string& out, const std::string& variants, const std::string& how) {
  if (how == "optimizer_first") return set_up_optimizer_first(variants);
  fulgor::test::register_fp16_scaling_cpu();
  torch::serialize::OutputArchive archive;
  std::stringstream list(variants);
  for (std::string variant; std::getline(list, variant, ',');) {
    ShardedRun run;
    run.sharded_checkpoints = variant.find("_dcp") != std::string::npos;
    run.spiked = ends_with(variant, "_spike");
    run.strategy = variant.substr(0, variant.find(run.sharded_checkpoints          ? "_dcp"
                                                  : ends_with(variant, "_resumed") ? "_resumed"
                                                  : run.spiked                     ? "_spike"
                                                                                   : "_twice"));
    run.bare_step = how == "bare_step";
    run.sync_every_pass = ends_with(variant, "_twice");
    if (ends_with(variant, "_resumed")) {
      ShardedRun first = run;
      first.until = 1;
      first.save_to = out + "/" + variant + ".ckpt";
      train_sharded(first);
      run.from = 1;
      run.resume_from = first.save_to;
    }
    archive.write(variant, train_sharded(run));
  }
  archive.save_to(out + "/sharded_rank" + std::to_string(fulgor::detect_distributed_environment().rank) + ".pt");
}

void run_trainer(const std::string& out, int64_t epochs, int64_t accumulate) {
  RegressionNet model(init_seed(fulgor::detect_distributed_environment().rank));
  auto loader = make_loader(2, fulgor::detect_distributed_environment().rank);
  fulgor::TrainerOptions options = quiet(ddp_options(out, epochs, accumulate));
  fulgor::Trainer trainer(options);
  trainer.fit(model, loader);
  write_parameters(out + "/trainer_rank" + std::to_string(trainer.global_rank()) + ".pt", model);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: fulgor_fabric_worker fabric|trainer OUTDIR EPOCHS ACCUMULATE\n"
                 "       fulgor_fabric_worker adam OUTDIR EPOCHS none|after_setup|before_setup|apart\n"
                 "       fulgor_fabric_worker plain_backward OUTDIR 1 1\n"
                 "       fulgor_fabric_worker sharded OUTDIR VARIANT,... run|bare_step|optimizer_first\n";
    return 2;
  }
  const std::string mode = argv[1], out = argv[2];
  try {
    if (mode == "sharded") {
      run_sharded(out, argv[3], argv[4]);
      return 0;
    }
    const int64_t epochs = std::stoll(argv[3]);
    if (mode == "adam") {
      run_adam(out, epochs, argv[4]);
      return 0;
    }
    if (mode == "plain_backward") {
      run_plain_backward();
      return 0;
    }
    const int64_t accumulate = std::stoll(argv[4]);
    if (mode == "fabric")
      run_fabric(out, epochs, accumulate);
    else
      run_trainer(out, epochs, accumulate);
  } catch (const fulgor::Error& e) {
    std::cerr << "fulgor::Error: " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "exception: " << e.what() << "\n";
    return 4;
  }
  return 0;
}
