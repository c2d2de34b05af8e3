// Sharded training's memory and speed: per rank, the bytes held in the
// parameters, in their gradients and in the optimizer's state, counted from
// the tensors after an optimizer step, and the process's peak resident
// memory, with steps per second, for ddp, ZeRO-1 (zero_redundancy_optimizer)
// and fsdp's SHARD_GRAD_OP and FULL_SHARD (in float32, and under bf16-mixed,
// whose units are gathered in bfloat16: Note [Sharded mixed precision]) on 2
// and 4 CPU ranks started by fulgor-run, against ddp's figures and the ZeRO paper's bounds for Adam in
// float32 (Ψ parameters, N ranks: optimizer state 8Ψ under ddp, 8Ψ/N
// sharded; gradients 4Ψ, 4Ψ/N under SHARD_GRAD_OP; everything 16Ψ/N under
// FULL_SHARD). The parameters' bytes are those their storage holds (a
// released unit's hold none) plus the optimizer's pieces.

#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "benchmarks.h"
#include "fulgor/data/tensor_loader.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/distributed/sharded_unit.h"
#include "fulgor/module.h"
#include "fulgor/optim/adam.h"
#include "fulgor/trainer.h"

namespace fulgor::bench {
namespace {

constexpr int64_t kRankBatch = 8;

// Three square layers, each a unit of FULL_SHARD: 50.3M parameters at width
// 4096.
struct Stack : fulgor::Module {
  torch::nn::Sequential net{nullptr};
  explicit Stack(int64_t width) {
    net = register_module("net",
                          torch::nn::Sequential(fulgor::Sharded(torch::nn::Linear(width, width)), torch::nn::ReLU(),
                                                fulgor::Sharded(torch::nn::Linear(width, width)), torch::nn::ReLU(),
                                                fulgor::Sharded(torch::nn::Linear(width, width))));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::mse_loss(net->forward(batch.data), batch.target);
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<fulgor::Adam>(parameters(), torch::optim::AdamOptions(1e-4));
  }
};

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// What the rank holds after its last step, and how fast the steps after the
// first `warmup` went.
class Meter final : public fulgor::Callback {
 public:
  Meter(int64_t warmup, int64_t steps) : warmup_(warmup), steps_(steps) {}
  void on_train_batch_start(fulgor::Trainer&, fulgor::ModuleBase&, int64_t batch) override {
    if (batch == warmup_) start_ = std::chrono::steady_clock::now();
  }
  void on_train_batch_end(fulgor::Trainer& trainer, fulgor::ModuleBase& module, const torch::Tensor&,
                          int64_t batch) override {
    if (batch + 1 != steps_) return;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    auto& optimizer = *trainer.optimizers().front();
    for (const auto& p : module.parameters()) {
      params += static_cast<int64_t>(p.storage().nbytes());
      grads += bytes_of(p.grad());
    }
    for (const auto& group : optimizer.param_groups())
      for (const auto& p : group.params())
        if (!module_owns(module, p)) {  // a piece
          params += bytes_of(p);
          grads += bytes_of(p.grad());
        }
    for (const auto& [key, state] : optimizer.state()) {
      const auto& adam = static_cast<const torch::optim::AdamParamState&>(*state);
      this->state += bytes_of(adam.exp_avg()) + bytes_of(adam.exp_avg_sq()) + bytes_of(adam.max_exp_avg_sq());
    }
  }
  int64_t params = 0, grads = 0, state = 0;
  double seconds = 0;

 private:
  static bool module_owns(fulgor::ModuleBase& module, const torch::Tensor& t) {
    for (const auto& p : module.parameters())
      if (p.is_same(t)) return true;
    return false;
  }
  int64_t warmup_, steps_;
  std::chrono::steady_clock::time_point start_;
};

fulgor::TrainerOptions options_for(const std::string& variant, int64_t steps) {
  fulgor::TrainerOptions o;
  o.accelerator = "cpu";
  const bool full_shard = variant.rfind("full_shard", 0) == 0;
  o.strategy = variant == "shard_grad_op" || full_shard ? "fsdp" : "ddp";
  o.sharding_strategy = full_shard ? "FULL_SHARD" : "SHARD_GRAD_OP";
  o.zero_redundancy_optimizer = variant == "zero1";
  if (variant == "full_shard_bf16") o.precision = "bf16-mixed";
  o.max_steps = steps;
  o.logger = false;
  o.enable_checkpointing = false;
  o.enable_progress_bar = false;
  o.enable_model_summary = false;
  o.num_sanity_val_steps = 0;
  return o;
}

struct Figures {
  int64_t params = 0, grads = 0, state = 0, peak = 0;
  double steps_per_second = 0;
};

// Starts `ranks` ranks of this program's child mode under fulgor-run; rank 0's
// figures, with the largest peak over the ranks.
Figures run_ranks(const std::string& variant, int ranks, int64_t width, int64_t steps) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("fulgor-sharded-bench-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string command =
      fmt::format("{} --nproc-per-node {} -- /proc/{}/exe --sharded-child {} {} {} {} > {}/log 2>&1", FULGOR_RUN_PATH,
                  ranks, ::getpid(), variant, width, steps, dir.string(), dir.string());
  if (std::system(command.c_str()) != 0) {
    std::ifstream log(dir / "log");
    std::cerr << log.rdbuf();
    throw std::runtime_error("the sharded benchmark's ranks failed: " + command);
  }
  Figures figures;
  for (int rank = 0; rank < ranks; ++rank) {
    std::ifstream in(dir / fmt::format("rank{}.json", rank));
    const auto json = nlohmann::json::parse(in);
    figures.peak = std::max(figures.peak, json.at("peak").get<int64_t>());
    if (rank != 0) continue;
    figures.params = json.at("params");
    figures.grads = json.at("grads");
    figures.state = json.at("state");
    figures.steps_per_second = json.at("steps_per_second");
  }
  std::filesystem::remove_all(dir);
  return figures;
}

std::string megabytes(int64_t bytes) { return fmt::format("{:.0f} MB", static_cast<double>(bytes) / 1e6); }

}  // namespace

int sharded_child(const std::string& variant, int64_t width, int64_t steps, const std::string& out) {
  torch::manual_seed(0);
  Stack model(width);
  TensorLoaderOptions loader_options;
  loader_options.batch_size = kRankBatch;
  const int64_t samples = kRankBatch * fulgor::detect_distributed_environment().world_size * steps;
  TensorLoader loader(torch::randn({samples, width}), torch::randn({samples, width}), loader_options);
  auto meter = std::make_shared<Meter>(1, steps);
  auto options = options_for(variant, steps);
  options.callbacks = {meter};
  fulgor::Trainer trainer(options);
  trainer.fit(model, loader);
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  nlohmann::json json = {{"params", meter->params},
                         {"grads", meter->grads},
                         {"state", meter->state},
                         {"peak", static_cast<int64_t>(usage.ru_maxrss) * 1024},
                         {"steps_per_second", static_cast<double>(steps - 1) / meter->seconds}};
  std::ofstream(fmt::format("{}/rank{}.json", out, trainer.global_rank())) << json.dump();
  return 0;
}

void sharded_benchmark(Report& report, const Settings& settings) {
  const int64_t width = settings.quick ? 256 : 4096, steps = settings.quick ? 3 : 6;
  const double psi = 3.0 * static_cast<double>(width * width + width);
  for (int ranks : {2, 4}) {
    const Figures ddp = run_ranks("ddp", ranks, width, steps);
    report.row({"sharded", fmt::format("{:.1f}M params, {} ranks, ddp", psi / 1e6, ranks),
                fmt::format("state {}, grads {}, params {}, peak {}; {:.2f} steps/s", megabytes(ddp.state),
                            megabytes(ddp.grads), megabytes(ddp.params), megabytes(ddp.peak), ddp.steps_per_second),
                ""});
    for (const char* variant : {"zero1", "shard_grad_op", "full_shard", "full_shard_bf16"}) {
      const Figures f = run_ranks(variant, ranks, width, steps);
      const double state_bound = 8 * psi / ranks, grads_bound = 4 * psi / ranks, all_bound = 16 * psi / ranks;
      report.row({"sharded", fmt::format("{:.1f}M params, {} ranks, {}", psi / 1e6, ranks, variant),
                  fmt::format("state {}, grads {}, params {}, peak {}; {:.2f} steps/s", megabytes(f.state),
                              megabytes(f.grads), megabytes(f.params), megabytes(f.peak), f.steps_per_second),
                  fmt::format("state {:.3f}× 8Ψ/N, grads {:.3f}× 4Ψ/N, all {:.3f}× 16Ψ/N, peak {:.2f}× ddp's, "
                              "{:.2f}× ddp's time",
                              static_cast<double>(f.state) / state_bound, static_cast<double>(f.grads) / grads_bound,
                              static_cast<double>(f.state + f.grads + f.params) / all_bound,
                              static_cast<double>(f.peak) / static_cast<double>(ddp.peak),
                              ddp.steps_per_second / f.steps_per_second)});
      report.figures[fmt::format("sharded_{}_{}_state_vs_bound", variant, ranks)] =
          static_cast<double>(f.state) / state_bound;
      report.figures[fmt::format("sharded_{}_{}_time_vs_ddp", variant, ranks)] =
          ddp.steps_per_second / f.steps_per_second;
    }
  }
}

}  // namespace fulgor::bench
