#include "loops.h"

#include <iostream>
#include <sstream>

#include "fulgor/data/tensor_loader.h"
#include "fulgor/fabric/fabric.h"
#include "fulgor/module.h"
#include "fulgor/optim/adam.h"
#include "fulgor/trainer.h"

namespace fulgor::bench {
namespace {

torch::nn::Sequential copy_of(const torch::nn::Sequential& net) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone()));
}

struct Classifier : fulgor::Module {
  torch::nn::Sequential net;
  int logs = 0;
  const Variant& variant;
  Classifier(torch::nn::Sequential n, const Variant& v)
      : net(register_module("net", std::move(n))), logs(v.log_calls), variant(v) {}
  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    auto loss = torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target);
    if (logs > 0) {
      fulgor::LogOptions options;
      options.prog_bar = true;
      log("train_loss", loss, options);
    }
    if (logs > 1) log("batch_idx", static_cast<double>(batch_idx));
    return loss;
  }
  void optimizer_zero_grad(int64_t, int64_t, torch::optim::Optimizer& optimizer) override {
    fulgor::zero_grad(optimizer, /*set_to_none=*/!variant.zeroed_in_place);
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    if (variant.optimizer == "adam")
      return fulgor::OptimizerConfig(
          std::make_shared<fulgor::Adam>(parameters(), torch::optim::AdamOptions(1e-3), variant.kernels));
    return fulgor::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
};

// Swallows what the Trainer prints while it is timed, so the table stays readable.
struct QuietStdout {
  std::ostringstream sink;
  std::streambuf* saved = std::cout.rdbuf(sink.rdbuf());
  ~QuietStdout() { std::cout.rdbuf(saved); }
};

}  // namespace

double final_loss(torch::nn::Sequential net, const Workload& work) {
  torch::NoGradGuard no_grad;
  return torch::nn::functional::cross_entropy(net->forward(work.data), work.targets).item<double>();
}

torch::nn::Sequential raw_fit(const torch::nn::Sequential& initial, const Workload& work,
                              const std::string& optimizer_name) {
  auto net = copy_of(initial);
  std::unique_ptr<torch::optim::Optimizer> made;
  if (optimizer_name == "adam")
    made = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-3));
  else
    made = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.01));
  torch::optim::Optimizer& optimizer = *made;
  const int64_t samples = work.data.size(0);
  for (int64_t epoch = 0; epoch < work.epochs; ++epoch)
    for (int64_t start = 0; start + kBatch <= samples; start += kBatch) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(net->forward(work.data.narrow(0, start, kBatch)),
                                                       work.targets.narrow(0, start, kBatch));
      loss.backward();
      optimizer.step();
    }
  return net;
}

torch::nn::Sequential fabric_fit(const torch::nn::Sequential& initial, const Workload& work) {
  Fabric fabric({.accelerator = "cpu", .devices = 1});
  fabric.launch();
  auto net = copy_of(initial);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01));
  auto optimizer = fabric.setup(net, sgd);
  TensorLoaderOptions loader_options;
  loader_options.batch_size = kBatch;
  loader_options.drop_last = true;
  auto loader = fabric.setup_dataloaders(TensorLoader(work.data, work.targets, loader_options));
  for (int64_t epoch = 0; epoch < work.epochs; ++epoch)
    for (auto& batch : loader) {
      optimizer.zero_grad();
      fabric.backward(torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target));
      optimizer.step();
    }
  return net;
}

torch::nn::Sequential fulgor_fit(const torch::nn::Sequential& initial, const Workload& work, const Variant& variant,
                                 const std::string& root_dir) {
  Classifier model(copy_of(initial), variant);
  TensorLoaderOptions loader_options;
  loader_options.batch_size = kBatch;
  loader_options.drop_last = true;
  TensorLoader loader(work.data, work.targets, loader_options);
  TrainerOptions options;
  options.accelerator = "cpu";
  options.devices = 1;
  options.max_epochs = work.epochs;
  options.num_sanity_val_steps = 0;
  options.enable_model_summary = false;
  options.enable_progress_bar = variant.progress_bar;
  options.enable_checkpointing = variant.checkpoint;
  options.precision = variant.precision;
  options.profiler = variant.profiler;
  options.logger = false;
  options.default_root_dir = root_dir;
  QuietStdout quiet;
  Trainer trainer(options);
  trainer.fit(model, loader);
  return model.net;
}

}  // namespace fulgor::bench
