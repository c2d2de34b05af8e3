// The program the sharded-strategy tests start as every rank (through
// fulgor-run):
//
//   fulgor_sharded_worker OUTDIR VARIANT...
//
// Each VARIANT is STRATEGY_OPTIMIZER, where STRATEGY is ddp, zero1 (ddp with
// zero_redundancy_optimizer), shard_grad_op, no_shard, full_shard,
// hybrid_shard (fsdp with that sharding_strategy, on the launcher's nodes),
// full_shard_ckpt (full_shard with units that checkpoint their activations)
// or full_shard_keep (units with reshard_after_forward false), any of them
// followed by _dcp for sharded checkpoints (state_dict_type "sharded":
// folders), _spike (SpikedNet under precision "16-mixed": every rank
// writes its final loss scale too, as VARIANT_scale), _bf16 (float32,
// precision "bf16-mixed"), _wide (WideNet, with sgd) or _uneven (the last
// rank's module has a parameter more), and OPTIMIZER is adam (fulgor::Adam
// with weight decay, gradients clipped by norm, accumulating 2 batches) or sgd
// (torch::optim::SGD with momentum, clipped by value). For each, the rank
// fits ShardedNet kEpochs epochs in float64 and saves a checkpoint at the
// end; a VARIANT ending in "_resumed" instead fits until the middle of the
// second epoch, saves OUTDIR/mid_VARIANT.ckpt there, and fits to the end from
// it with a new Trainer and model; "_from=PATH" resumes from the mid-fit
// checkpoint PATH (written by another run, of another world size). Rank 0
// writes every variant's final parameters to OUTDIR/params_rank0.pt under the
// variant's name, and so does every rank to its own file. Under full_shard
// and hybrid_shard each rank checks that the units' parameters hold no
// memory between steps, nor between forward and backward unless they keep
// them, and are whole on rank 0 alone while a checkpoint is made (on no
// rank while a sharded one is: Note [Fully sharded units]), that backward
// runs the units' forward again only where they checkpoint their
// activations, validates after each epoch, and full_shard_adam_resumed
// saves its mid-fit checkpoint in the background.
// Exits 0 on
// success, 3 with the message on a fulgor::Error, 4 on any other exception.

#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "../../support/fp16_cpu.h"
#include "ddp_trainer_scenario.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/optim/adam.h"
#include "sharded_scenario.h"
#include "worker_main.h"

namespace {

using namespace fulgor::test;

// Throws unless the parameters of ShardedNet's units hold no memory at the
// end of each batch and between forward and backward, or there, with
// `kept`, all of theirs, and, while a checkpoint is made during the fit,
// are whole on rank 0 alone, or with `sharded_checkpoints` nowhere.
class ReleasedBetweenSteps final : public fulgor::Callback {
 public:
  ReleasedBetweenSteps(bool sharded_checkpoints, bool kept) : sharded_checkpoints_(sharded_checkpoints), kept_(kept) {}
  void on_fit_start(fulgor::Trainer&, fulgor::ModuleBase&) override { fitting_ = true; }
  void on_fit_end(fulgor::Trainer&, fulgor::ModuleBase&) override { fitting_ = false; }
  void on_train_batch_end(fulgor::Trainer& trainer, fulgor::ModuleBase& module, const torch::Tensor&,
                          int64_t) override {
    expect(module, 0, "after step " + std::to_string(trainer.global_step()));
  }
  void on_before_backward(fulgor::Trainer& trainer, fulgor::ModuleBase& module, const torch::Tensor&) override {
    expect(module, kept_ ? whole(module) : 0, "before the backward of step " + std::to_string(trainer.global_step()));
    // Note [Sharded mixed precision]: under bf16-mixed the units computed
    // with parameters gathered in bfloat16, float32 between their passes.
    const auto& net = dynamic_cast<ShardedNet&>(module);
    const auto expected = trainer.precision().name == "bf16-mixed" ? torch::kBFloat16 : net.dtype;
    if (*net.computed_in != expected || (!kept_ && net.net->parameters()[0].scalar_type() != net.dtype))
      throw std::runtime_error(std::string("the units computed in ") + c10::toString(*net.computed_in) + " and hold " +
                               c10::toString(net.net->parameters()[0].scalar_type()) + " after");
  }
  void on_save_checkpoint(fulgor::Trainer& trainer, fulgor::ModuleBase& module, nlohmann::json&) override {
    if (!fitting_) return;
    expect(module, trainer.global_rank() == 0 && !sharded_checkpoints_ ? whole(module) : 0,
           "while a checkpoint is made");
  }

 private:
  static int64_t whole(fulgor::ModuleBase& module) { return dynamic_cast<ShardedNet&>(module).whole_parameter_bytes(); }
  static void expect(fulgor::ModuleBase& module, int64_t bytes, const std::string& when) {
    const int64_t held = dynamic_cast<ShardedNet&>(module).parameter_bytes();
    if (held != bytes)
      throw std::runtime_error(when + " the parameters hold " + std::to_string(held) + " bytes, not " +
                               std::to_string(bytes));
  }
  bool sharded_checkpoints_, kept_;
  bool fitting_ = false;
};

// Throws unless backward runs the units' forward again (once each) when,
// and only when, they checkpoint their activations.
class RecomputedInBackward final : public fulgor::Callback {
 public:
  void on_before_backward(fulgor::Trainer&, fulgor::ModuleBase& module, const torch::Tensor&) override {
    before_ = *dynamic_cast<ShardedNet&>(module).forwards;
  }
  void on_after_backward(fulgor::Trainer&, fulgor::ModuleBase& module) override {
    const auto& net = dynamic_cast<ShardedNet&>(module);
    const int64_t again = *net.forwards - before_, expected = net.checkpoint_activations ? 2 : 0;
    if (again != expected)
      throw std::runtime_error("backward ran the units' forward " + std::to_string(again) + " times, not " +
                               std::to_string(expected));
  }

 private:
  int64_t before_ = 0;
};

// The final parameters, flattened; `scale`: the final loss scale.
torch::Tensor fit(const ShardedVariant& variant, const std::string& out, const std::string& resume_from,
                  std::optional<int64_t> stop_at, const std::string& save_to, double* scale = nullptr) {
  const auto env = fulgor::detect_distributed_environment();
  const int64_t rank = env.rank;
  std::unique_ptr<ShardedNet> net;
  if (variant.spiked)
    net = std::make_unique<SpikedNet>(rank);
  else if (variant.wide)
    net = std::make_unique<WideNet>();
  else
    net = std::make_unique<ShardedNet>(kShardedSeed, variant.optimizer, variant.checkpoint_activations,
                                       variant.reshard_after_forward, variant.bf16 ? torch::kFloat32 : torch::kFloat64);
  if (variant.uneven && rank == env.world_size - 1)
    net->register_parameter("extra", torch::zeros({1}, torch::kFloat64));
  ShardedNet& model = *net;
  auto loader = make_loader(env.world_size, rank);
  auto options = sharded_options(variant, out + "/rank" + std::to_string(rank));
  options.num_nodes = env.world_size / env.local_world_size;
  if (stop_at) {
    options.max_steps = *stop_at;
    // Under FULL_SHARD only rank 0 gathers and copies for a background save.
    options.async_checkpointing = variant.shards_units() && variant.optimizer == "adam";
    options.callbacks = {std::make_shared<SaveAtStep>(*stop_at, save_to, options.async_checkpointing)};
  }
  // Under full_shard and hybrid_shard, validation (which changes no
  // parameter) runs the units under inference mode.
  std::optional<fulgor::TensorLoader> val_loader;
  if (variant.shards_units()) {
    options.callbacks.push_back(
        std::make_shared<ReleasedBetweenSteps>(variant.sharded_checkpoints, !variant.reshard_after_forward));
    options.callbacks.push_back(std::make_shared<RecomputedInBackward>());
    val_loader.emplace(make_loader(env.world_size, rank));
  }
  fulgor::Trainer trainer(options);
  if (val_loader)
    trainer.fit(model, loader, *val_loader, fulgor::FitOptions{resume_from});
  else
    trainer.fit(model, loader, fulgor::FitOptions{resume_from});
  if (!stop_at) trainer.save_checkpoint(out + "/" + variant.name + ".ckpt");
  if (scale && trainer.grad_scaler()) *scale = trainer.grad_scaler()->get_scale();
  return flat_parameters(model);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rank = 0;
  return fulgor::test::run_worker(rank, [&] {
    torch::set_num_threads(1);
    register_fp16_scaling_cpu();
    rank = fulgor::detect_distributed_environment().rank;
    if (argc < 3) {
      std::cerr << "usage: fulgor_sharded_worker OUTDIR VARIANT...\n";
      return 2;
    }
    const std::string out = argv[1];
    torch::serialize::OutputArchive archive;
    for (int i = 2; i < argc; ++i) {
      const ShardedVariant variant = parse_variant(argv[i]);
      torch::Tensor params;
      if (!variant.from.empty()) {
        params = fit(variant, out, variant.from, std::nullopt, "");
      } else if (variant.resumed) {
        const std::string mid = out + "/mid_" + variant.name + ".ckpt";
        fit(variant, out, "", kShardedMidStep, mid);
        params = fit(variant, out, mid, std::nullopt, "");
      } else {
        double scale = 0;
        params = fit(variant, out, "", std::nullopt, "", &scale);
        if (variant.spiked) archive.write(variant.name + "_scale", torch::tensor({scale}, torch::kFloat64));
      }
      archive.write(variant.name, params);
    }
    archive.save_to(out + "/params_rank" + std::to_string(rank) + ".pt");
    return 0;
  });
}
