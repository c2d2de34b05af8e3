// The program the distributed tests start as every rank (through fulgor-run or
// directly with the launcher's variables set):
//
//   fulgor_distributed_worker SCENARIO OUTDIR [ARGS...]
//
// Each scenario writes what the test checks into OUTDIR. Exits 0 on success,
// 3 with the message on a fulgor::Error, 4 on any other exception.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/distributed/gradient_sync.h"
#include "fulgor/distributed/process_group.h"
#include "fulgor/distributed/sync_batchnorm.h"
#include "fulgor/metrics.h"
#include "fulgor/optim/zero_grad.h"
#include "dcp_scenario.h"
#include "scenarios.h"
#include "worker_main.h"

namespace {

using fulgor::test::kGlobalBatch;

struct Context {
  fulgor::DistributedEnvironment env;
  std::string out;
  std::string file(const std::string& name) const {
    return out + "/" + name + "_rank" + std::to_string(env.rank) + ".pt";
  }
};

fulgor::ProcessGroup make_group(const Context& c, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto cpu = fulgor::make_accelerator("cpu");
  return fulgor::ProcessGroup(c.env, *cpu, torch::Device(torch::kCPU), {/*backend=*/"", timeout});
}

void save(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  torch::serialize::OutputArchive archive;
  for (const auto& [name, tensor] : tensors) archive.write(name, tensor);
  archive.save_to(path);
}

torch::Tensor flat_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : module.parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat).clone();
}

torch::Tensor flat_gradients(torch::nn::Module& module) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : module.parameters()) flat.push_back(p.grad().detach().reshape({-1}));
  return torch::cat(flat).clone();
}

// The launcher's view of this process.
void scenario_env(const Context& c) {
  std::ofstream(c.out + "/env_rank" + std::to_string(c.env.rank) + ".txt")
      << c.env.rank << ' ' << c.env.local_rank << ' ' << c.env.world_size << ' ' << c.env.local_world_size << ' '
      << c.env.node_rank << ' ' << c.env.master_addr << ' ' << c.env.master_port << ' ' << c.env.source << '\n';
}

// Rank `failing` exits with `code` at once; the others wait to be stopped.
void scenario_fail(const Context& c, int64_t failing, int code) {
  if (c.env.rank == failing) std::exit(code);
  std::ofstream(c.out + "/started_rank" + std::to_string(c.env.rank));
  std::this_thread::sleep_for(std::chrono::seconds(60));
  std::ofstream(c.out + "/finished_rank" + std::to_string(c.env.rank));
}

void scenario_collectives(const Context& c) {
  fulgor::ProcessGroup group = make_group(c);
  const double r = static_cast<double>(c.env.rank);
  const auto values = [&] { return torch::tensor({r + 1, 10 * (r + 1)}, torch::kFloat32); };
  torch::Tensor sum = values(), mean = values(), max = values(), min = values();
  group.all_reduce(sum, fulgor::ReduceOp::sum);
  group.all_reduce(mean, fulgor::ReduceOp::mean);
  group.all_reduce(max, fulgor::ReduceOp::max);
  group.all_reduce(min, fulgor::ReduceOp::min);
  const double metric = group.all_reduce(0.5 * (r + 1), fulgor::ReduceOp::mean);
  torch::Tensor from_one = torch::full({3}, r + 5);
  group.broadcast(from_one, 1);
  torch::manual_seed(fulgor::test::init_seed(c.env.rank));
  torch::nn::Linear linear(3, 2);
  group.broadcast_module(*linear);
  group.barrier();
  // Part r of the ranks' sums goes to rank r; a large message first, so that
  // the smaller ones after it reuse the group's working memory.
  torch::Tensor large_in = torch::arange(1000, torch::kFloat32) + 1000 * r, large = torch::empty({500});
  group.reduce_scatter_tensor(large, large_in, fulgor::ReduceOp::sum);
  torch::Tensor scattered = torch::empty({2}), scattered_mean = torch::empty({2}, torch::kFloat64);
  torch::Tensor scattered_max = torch::empty({2}), scattered_bf16 = torch::empty({2}, torch::kBFloat16);
  const torch::Tensor parts = torch::arange(4, torch::kFloat32) + 10 * r;
  group.reduce_scatter_tensor(scattered, parts, fulgor::ReduceOp::sum);
  group.reduce_scatter_tensor(scattered_mean, parts.to(torch::kFloat64), fulgor::ReduceOp::mean);
  group.reduce_scatter_tensor(scattered_max, parts, fulgor::ReduceOp::max);
  group.reduce_scatter_tensor(scattered_bf16, (parts / 4).to(torch::kBFloat16), fulgor::ReduceOp::sum);
  torch::Tensor gathered = torch::empty({2, 2}), gathered_bf16 = torch::empty({4}, torch::kBFloat16);
  group.all_gather_into_tensor(gathered, torch::tensor({r + 1, r + 2}, torch::kFloat32));
  group.all_gather_into_tensor(gathered_bf16, torch::tensor({r + 0.5, r + 1.5}, torch::kBFloat16));
  std::string refused;
  try {
    torch::Tensor too_small = torch::empty({3});
    group.all_gather_into_tensor(too_small, torch::ones({2}));
  } catch (const fulgor::ConfigError& e) {
    refused = e.what();
  }
  std::ofstream(c.out + "/refused_rank" + std::to_string(c.env.rank) + ".txt") << refused;
  save(c.file("collectives"), {{"sum", sum},
                               {"mean", mean},
                               {"max", max},
                               {"min", min},
                               {"metric", torch::tensor(metric, torch::kFloat64)},
                               {"broadcast", from_one},
                               {"module", flat_parameters(*linear)},
                               {"large", large},
                               {"scattered", scattered},
                               {"scattered_mean", scattered_mean},
                               {"scattered_max", scattered_max},
                               {"scattered_bf16", scattered_bf16.to(torch::kFloat32)},
                               {"gathered", gathered},
                               {"gathered_bf16", gathered_bf16.to(torch::kFloat32)}});
}

// Each rank updates the metrics with its unequal shard of the metric data,
// then computes them alone and over both ranks.
void scenario_metrics(const Context& c) {
  fulgor::ProcessGroup group = make_group(c);
  const fulgor::test::MetricData d = fulgor::test::make_metric_data();
  const int64_t begin = c.env.rank == 0 ? 0 : fulgor::test::kMetricShard0;
  const int64_t end = c.env.rank == 0 ? fulgor::test::kMetricShard0 : fulgor::test::kMetricSamples;
  fulgor::metrics::ClassificationOptions macro;
  macro.task = "multiclass";
  macro.num_classes = 3;
  macro.average = "macro";
  fulgor::metrics::Accuracy accuracy(macro);
  fulgor::metrics::F1Score f1(macro);
  fulgor::metrics::AUROC auroc;
  fulgor::metrics::MeanSquaredError mse;
  fulgor::metrics::MeanMetric mean;
  for (int64_t b = begin; b < end; b += fulgor::test::kMetricBatch) {
    const int64_t n = std::min(fulgor::test::kMetricBatch, end - b);
    accuracy.update(d.scores.narrow(0, b, n), d.labels.narrow(0, b, n));
    f1.update(d.scores.narrow(0, b, n), d.labels.narrow(0, b, n));
    auroc.update(d.probs.narrow(0, b, n), d.binary.narrow(0, b, n));
    mse.update(d.preds.narrow(0, b, n), d.target.narrow(0, b, n));
    mean.update(d.preds.narrow(0, b, n).mean(), static_cast<double>(n));
  }
  std::vector<std::pair<std::string, torch::Tensor>> results;
  for (auto [name, metric] : std::vector<std::pair<std::string, fulgor::metrics::Metric*>>{
           {"accuracy", &accuracy}, {"f1", &f1}, {"auroc", &auroc}, {"mse", &mse}, {"mean", &mean}}) {
    results.emplace_back(name, metric->compute(group));
    results.emplace_back(name + "_local", metric->compute());
  }
  save(c.file("metrics"), results);
}

// Data-parallel SGD: each rank trains on its half of every global batch.
void scenario_train(const Context& c, int64_t steps) {
  fulgor::ProcessGroup group = make_group(c);
  auto model = fulgor::test::make_model(fulgor::test::init_seed(c.env.rank));
  // A tiny bucket cap, so the parameters form several buckets.
  fulgor::GradientSynchronizer sync(group, *model, {/*bucket_cap_mb=*/64.0 / (1 << 20)});
  const torch::Tensor initial = flat_parameters(*model);
  auto [x, y] = fulgor::test::make_data(steps);
  torch::optim::SGD optimizer(model->parameters(), fulgor::test::kLearningRate);
  const int64_t local = kGlobalBatch / c.env.world_size;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t begin = step * kGlobalBatch + c.env.rank * local;
    optimizer.zero_grad();
    sync.before_forward();
    torch::Tensor loss = torch::mse_loss(model->forward(x.narrow(0, begin, local)), y.narrow(0, begin, local));
    sync.backward(loss);
    optimizer.step();
  }
  save(c.file("train"), {{"initial", initial},
                         {"final", flat_parameters(*model)},
                         {"buckets", torch::tensor(sync.bucket_count())},
                         {"reductions", torch::tensor(sync.reductions_started())}});
}

// Two micro-batches accumulated without communication, then one synchronized.
void scenario_nosync(const Context& c) {
  fulgor::ProcessGroup group = make_group(c);
  auto model = fulgor::test::make_model(fulgor::test::init_seed(c.env.rank));
  fulgor::GradientSynchronizer sync(group, *model, {/*bucket_cap_mb=*/64.0 / (1 << 20)});
  auto [x, y] = fulgor::test::make_data(1);
  // Micro-batch m of rank r: 8 rows of the global batch.
  const auto batch = [&](int64_t m) { return c.env.rank * 16 + m * 8; };
  for (int64_t m = 0; m < 2; ++m) {
    auto guard = sync.no_sync();
    sync.before_forward();
    sync.backward(torch::mse_loss(model->forward(x.narrow(0, batch(m), 8)), y.narrow(0, batch(m), 8)));
  }
  const torch::Tensor local = flat_gradients(*model);
  const int64_t reductions_before = sync.reductions_started();
  sync.before_forward();
  sync.backward(torch::mse_loss(model->forward(x.narrow(0, batch(0), 8)), y.narrow(0, batch(0), 8)));
  save(c.file("nosync"), {{"local", local},
                          {"synced", flat_gradients(*model)},
                          {"reductions_before", torch::tensor(reductions_before)},
                          {"reductions_after", torch::tensor(sync.reductions_started())},
                          {"buckets", torch::tensor(sync.bucket_count())}});
}

// Note [A parameter's storage replaced] (gradient_sync.h): every parameter
// takes new storage after the synchronizer hooked it, as a checkpoint load
// does; one step on the rank's half of the batch must still be averaged.
void scenario_storage_replaced(const Context& c) {
  fulgor::ProcessGroup group = make_group(c);
  auto model = fulgor::test::make_model(fulgor::test::init_seed(c.env.rank));
  fulgor::GradientSynchronizer sync(group, *model, {/*bucket_cap_mb=*/64.0 / (1 << 20)});
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.set_(p.detach().clone());
  }
  auto [x, y] = fulgor::test::make_data(1);
  const int64_t local = kGlobalBatch / c.env.world_size, begin = c.env.rank * local;
  sync.before_forward();
  sync.backward(torch::mse_loss(model->forward(x.narrow(0, begin, local)), y.narrow(0, begin, local)));
  save(c.file("storage_replaced"), {{"grads", flat_gradients(*model)}});
}

// Note [Parameters some rank did not reach] (gradient_sync.cpp): two steps
// of Adam on two layers; in the second, rank 0 reaches `b` with a gradient of
// zeros and rank 1 does not reach it. Every rank must step `b` (by Adam's
// momentum) as PyTorch's DDP does, or the ranks part.
void scenario_unreached(const Context& c) {
  fulgor::ProcessGroup group = make_group(c);
  torch::manual_seed(0);
  torch::nn::Linear a(fulgor::test::kFeatures, 1), b(fulgor::test::kFeatures, 1);
  torch::nn::ModuleList model(a, b);
  fulgor::GradientSynchronizer sync(group, *model);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.1));
  auto [x, y] = fulgor::test::make_data(2);
  const int64_t local = kGlobalBatch / c.env.world_size;
  torch::Tensor after_first;
  for (int64_t step = 0; step < 2; ++step) {
    fulgor::zero_grad(adam);
    const torch::Tensor input = x.narrow(0, step * kGlobalBatch + c.env.rank * local, local);
    torch::Tensor prediction = a(input);
    if (step == 0) prediction = prediction + b(input);
    if (step == 1 && c.env.rank == 0) prediction = prediction + 0 * b(input);
    sync.before_forward();
    sync.backward(torch::mse_loss(prediction, y.narrow(0, step * kGlobalBatch + c.env.rank * local, local)));
    adam.step();
    if (step == 0) after_first = b->weight.detach().clone();
  }
  save(c.file("unreached"), {{"after_first", after_first},
                             {"final", b->weight.detach().clone()},
                             {"has_gradient", torch::tensor(b->weight.grad().defined())}});
}

// A module whose one parameter the test replaces by another tensor, which
// the synchronizer never saw.
struct Swappable : torch::nn::Module {
  Swappable() { register_parameter("w", torch::ones({fulgor::test::kFeatures, 1})); }
  torch::Tensor forward(const torch::Tensor& x) { return x.matmul(named_parameters()["w"]); }
  void replace_w() { parameters_["w"] = torch::ones({fulgor::test::kFeatures, 1}).requires_grad_(); }
};

// The guard of Note [Ranks in step]: "parameters" makes rank 1's parameters
// differ before check_in_step; "replaced" trains a replaced parameter, whose
// gradient no rank synchronizes. Both must end in a DistributedError.
void scenario_out_of_step(const Context& c, const std::string& mode) {
  fulgor::ProcessGroup group = make_group(c);
  auto [x, y] = fulgor::test::make_data(1);
  const int64_t local = kGlobalBatch / c.env.world_size, begin = c.env.rank * local;
  if (mode == "parameters") {
    auto model = fulgor::test::make_model(fulgor::test::init_seed(0));
    fulgor::GradientSynchronizer sync(group, *model);
    torch::NoGradGuard no_grad;
    if (c.env.rank == 1) model->parameters()[2].add_(1e-7);
    sync.check_in_step("a deliberate change");
    return;
  }
  Swappable model;
  fulgor::GradientSynchronizer sync(group, model);
  model.replace_w();
  sync.backward(torch::mse_loss(model.forward(x.narrow(0, begin, local)), y.narrow(0, begin, local)));
}

// Returns once every rank has started (LibTorch loaded): the group of a short
// timeout is made after it, so that a rank slow to start on a loaded machine
// is not taken for one that died. The test's own bound stops a hang.
void wait_for_every_rank(const Context& c) {
  auto started = [&](int64_t rank) { return c.out + "/started_rank" + std::to_string(rank); };
  std::ofstream(started(c.env.rank)).close();
  for (int64_t rank = 0; rank < c.env.world_size; ++rank)
    while (!std::filesystem::exists(started(rank))) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// One good step; then rank `victim` dies ("kill") or freezes ("stop"), and
// the others keep training until a collective fails.
void scenario_die(const Context& c, const std::string& mode, int64_t timeout_ms, int64_t victim) {
  wait_for_every_rank(c);
  fulgor::ProcessGroup group = make_group(c, std::chrono::milliseconds(timeout_ms));
  auto model = fulgor::test::make_model(fulgor::test::init_seed(0));
  fulgor::GradientSynchronizer sync(group, *model);
  auto [x, y] = fulgor::test::make_data(1);
  torch::optim::SGD optimizer(model->parameters(), fulgor::test::kLearningRate);
  for (int step = 0; step < 100000; ++step) {
    if (step == 1 && c.env.rank == victim) {
      std::ofstream(c.out + "/victim_ready");
      raise(mode == "stop" ? SIGSTOP : SIGKILL);
    }
    optimizer.zero_grad();
    sync.backward(torch::mse_loss(model->forward(x.narrow(0, 0, 8)), y.narrow(0, 0, 8)));
    optimizer.step();
  }
}

// Each rank converts the sync_batchnorm scenario's layers and runs a training
// step on its shard, then evaluates it (make_sync_bn_case).
void scenario_syncbn(const Context& c) {
  fulgor::ProcessGroup group = make_group(c);
  std::vector<std::pair<std::string, torch::Tensor>> results;
  for (const bool spatial : {false, true}) {
    const std::string tag = spatial ? "2d_" : "1d_";
    fulgor::test::SyncBnCase sc = fulgor::test::make_sync_bn_case(spatial);
    const size_t converted = fulgor::convert_sync_batchnorm(*sc.layer, group);
    const int64_t begin = c.env.rank == 0 ? 0 : fulgor::test::kSyncBnShard0;
    const int64_t end = c.env.rank == 0 ? fulgor::test::kSyncBnShard0 : fulgor::test::kSyncBnRows;
    torch::Tensor x = sc.x.slice(0, begin, end).clone().requires_grad_(true);
    torch::Tensor y = sc.layer->forward(x);
    (y * sc.upstream.slice(0, begin, end)).sum().backward();
    auto& bn = *sc.layer->ptr<fulgor::SyncBatchNormImpl>(0);
    sc.layer->eval();
    torch::Tensor evaluated = sc.layer->forward(x.detach());
    results.insert(results.end(), {{tag + "converted", torch::tensor(static_cast<int64_t>(converted))},
                                   {tag + "y", y.detach()},
                                   {tag + "x_grad", x.grad()},
                                   {tag + "weight_grad", bn.weight.grad()},
                                   {tag + "bias_grad", bn.bias.grad()},
                                   {tag + "running_mean", bn.running_mean},
                                   {tag + "running_var", bn.running_var},
                                   {tag + "num_batches_tracked", bn.num_batches_tracked},
                                   {tag + "eval", evaluated}});
  }
  save(c.file("syncbn"), results);
}

}  // namespace

// Every rank saves its part of a distributed checkpoint into FOLDER; with
// `misplaced`, rank 1 gives a placement of the wrong rank.
void scenario_dcp_save(const Context& c, const std::string& folder, bool misplaced = false) {
  fulgor::ProcessGroup group = make_group(c);
  auto state = fulgor::test::dcp_state(c.env.rank, c.env.world_size, false);
  if (misplaced && c.env.rank == 1) state[0].placement->offsets.push_back(0);
  fulgor::save_distributed_checkpoint(state, folder, &group);
}

// Every rank loads its part, whatever number of ranks saved it.
void scenario_dcp_load(const Context& c, const std::string& folder) {
  auto state = fulgor::test::dcp_state(c.env.rank, c.env.world_size, true);
  fulgor::load_distributed_checkpoint(state, folder);
  save(c.file("dcp_loaded"), {{"a", state[0].value.toTensor()},
                              {"b", state[1].value.toTensor()},
                              {"replicated", state[2].value.toTensor()},
                              {"epoch", torch::tensor(state[3].value.toInt())}});
}

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  Context c;
  return fulgor::test::run_worker(c.env.rank, [&] {
    torch::set_num_threads(1);
    c.env = fulgor::detect_distributed_environment();
    c.out = argc > 2 ? argv[2] : ".";
    if (scenario == "env" && argc == 3) {
      scenario_env(c);
    } else if (scenario == "fail" && argc == 5) {
      scenario_fail(c, std::stoll(argv[3]), std::stoi(argv[4]));
    } else if (scenario == "sleep" && argc == 3) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
    } else if (scenario == "collectives" && argc == 3) {
      scenario_collectives(c);
    } else if (scenario == "metrics" && argc == 3) {
      scenario_metrics(c);
    } else if (scenario == "train" && argc == 4) {
      scenario_train(c, std::stoll(argv[3]));
    } else if (scenario == "nosync" && argc == 3) {
      scenario_nosync(c);
    } else if (scenario == "die" && (argc == 5 || argc == 6)) {
      scenario_die(c, argv[3], std::stoll(argv[4]), argc == 6 ? std::stoll(argv[5]) : c.env.world_size - 1);
    } else if (scenario == "syncbn" && argc == 3) {
      scenario_syncbn(c);
    } else if (scenario == "storage_replaced" && argc == 3) {
      scenario_storage_replaced(c);
    } else if (scenario == "unreached" && argc == 3) {
      scenario_unreached(c);
    } else if (scenario == "out_of_step" && argc == 4) {
      scenario_out_of_step(c, argv[3]);
    } else if (scenario == "dcp_save" && argc == 4) {
      scenario_dcp_save(c, argv[3]);
    } else if (scenario == "dcp_save_misplaced" && argc == 4) {
      scenario_dcp_save(c, argv[3], true);
    } else if (scenario == "dcp_load" && argc == 4) {
      scenario_dcp_load(c, argv[3]);
    } else {
      std::cerr << "usage: fulgor_distributed_worker "
                   "env|fail|sleep|collectives|metrics|train|nosync|die|syncbn|storage_replaced|unreached|"
                   "out_of_step|dcp_save|dcp_save_misplaced|dcp_load OUTDIR "
                   "[ARGS...]\n";
      return 2;
    }
    return 0;
  });
}
