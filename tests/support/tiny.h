#pragma once

// Tiny models and data shared by the trainer tests.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fulgor/fulgor.h"

namespace fulgor::testing {

// A regression set: y = 0.5 * sum(x) + noise.
struct XY : torch::data::datasets::Dataset<XY> {
  torch::Tensor x, y;
  XY(int64_t n, uint64_t seed) {
    auto g = at::detail::createCPUGenerator(seed);
    x = torch::randn({n, 4}, g);
    y = x.sum(1, true) * 0.5 + 0.1 * torch::randn({n, 1}, g);
  }
  torch::data::Example<> get(size_t i) override { return {x[static_cast<int64_t>(i)], y[static_cast<int64_t>(i)]}; }
  c10::optional<size_t> size() const override { return static_cast<size_t>(x.size(0)); }
};

inline auto sequential_loader(int64_t n, int64_t batch, uint64_t seed = 7) {
  return fulgor::make_data_loader<torch::data::samplers::SequentialSampler>(
      XY(n, seed).map(torch::data::transforms::Stack<>()), static_cast<size_t>(batch));
}

inline auto shuffled_loader(int64_t n, int64_t batch, uint64_t seed = 7) {
  return fulgor::make_data_loader<torch::data::samplers::RandomSampler>(
      XY(n, seed).map(torch::data::transforms::Stack<>()), static_cast<size_t>(batch));
}

struct TinyNet : fulgor::Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  torch::nn::Dropout drop{nullptr};
  std::function<fulgor::OptimizerConfig(TinyNet&)> make_optimizers;
  // Values validation logs as "val_loss", one per validation run.
  std::vector<double> scripted_val;
  int64_t training_steps = 0, validation_steps = 0, validation_runs = 0, test_steps = 0;

  explicit TinyNet(double dropout = 0.0) {
    l1 = register_module("l1", torch::nn::Linear(4, 8));
    l2 = register_module("l2", torch::nn::Linear(8, 1));
    drop = register_module("drop", torch::nn::Dropout(dropout));
  }
  torch::Tensor forward(const torch::Tensor& x) { return l2(drop(torch::tanh(l1(x)))); }

  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    ++training_steps;
    auto loss = torch::mse_loss(forward(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }
  void validation_step(torch::data::Example<> batch, int64_t) override {
    ++validation_steps;
    if (scripted_val.empty()) {
      log("val_loss", torch::mse_loss(forward(batch.data), batch.target));
    } else {
      const auto run = static_cast<size_t>(validation_runs - 1);
      log("val_loss", scripted_val[std::min(run, scripted_val.size() - 1)]);
    }
  }
  void on_validation_epoch_start() override { ++validation_runs; }
  void test_step(torch::data::Example<> batch, int64_t) override {
    ++test_steps;
    log("test_loss", torch::mse_loss(forward(batch.data), batch.target));
  }
  torch::Tensor predict_step(torch::data::Example<> batch, int64_t) override { return forward(batch.data); }
  fulgor::OptimizerConfig configure_optimizers() override {
    if (make_optimizers) return make_optimizers(*this);
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
  }
};

// Adam and a StepLR beside the weights: state a resume must restore.
inline std::unique_ptr<TinyNet> adam_step_lr_net(uint64_t seed, double dropout) {
  torch::manual_seed(seed);
  auto model = std::make_unique<TinyNet>(dropout);
  model->make_optimizers = [](TinyNet& m) {
    auto adam = std::make_shared<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(0.01));
    fulgor::SchedulerConfig step_lr;
    step_lr.scheduler = std::make_shared<fulgor::StepLR>(*adam, 1, 0.7);
    return fulgor::OptimizerConfig(adam, step_lr);
  };
  return model;
}

// A fresh folder under the test temp dir, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::path(::testing::TempDir()) /
           ("fulgor_trainer_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// Options for a quiet CPU run writing nothing unless a test asks.
inline fulgor::TrainerOptions quiet(const std::string& root) {
  fulgor::TrainerOptions o;
  o.accelerator = "cpu";
  o.devices = 1;
  o.logger = false;
  o.enable_checkpointing = false;
  o.enable_progress_bar = false;
  o.enable_model_summary = false;
  o.num_sanity_val_steps = 0;
  o.default_root_dir = root;
  return o;
}

// quiet() for `max_epochs` epochs with `callbacks`: the set-up most tests share.
inline fulgor::TrainerOptions quiet(const TempDir& dir, int64_t max_epochs,
                                    std::vector<std::shared_ptr<fulgor::Callback>> callbacks = {}) {
  auto o = quiet(dir.str());
  o.max_epochs = max_epochs;
  o.callbacks = std::move(callbacks);
  return o;
}

// Keeps every log_metrics call, with its step.
struct RecordingLogger : fulgor::Logger {
  std::vector<std::pair<int64_t, std::map<std::string, double>>> calls;
  std::string name() const override { return "recording"; }
  std::string version() const override { return "version_0"; }
  std::string log_dir() const override { return ""; }
  void log_hyperparams(const nlohmann::json&) override {}
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override {
    calls.emplace_back(step, metrics);
  }
  // The (step, value) of every call that logged `metric`.
  std::vector<std::pair<int64_t, double>> series(const std::string& metric) const {
    std::vector<std::pair<int64_t, double>> values;
    for (const auto& [step, metrics] : calls)
      if (auto it = metrics.find(metric); it != metrics.end()) values.emplace_back(step, it->second);
    return values;
  }
  // The steps of every call that logged `metric`.
  std::vector<int64_t> steps(const std::string& metric) const {
    std::vector<int64_t> result;
    for (const auto& [step, value] : series(metric)) result.push_back(step);
    return result;
  }
};

inline bool same_parameters(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i])) return false;
  return true;
}

// A model whose parameters equal `source`'s.
inline void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard g;
  auto pf = from.parameters(), pt = to.parameters();
  for (size_t i = 0; i < pf.size(); ++i) pt[i].copy_(pf[i]);
}

// A callback from lambdas, for one-off checks.
struct Hooks : fulgor::Callback {
  std::function<void(fulgor::Trainer&, int64_t)> batch_end;
  std::function<void(fulgor::Trainer&)> epoch_end;
  void on_train_batch_end(fulgor::Trainer& t, fulgor::ModuleBase&, const torch::Tensor&, int64_t i) override {
    if (batch_end) batch_end(t, i);
  }
  void on_train_epoch_end(fulgor::Trainer& t, fulgor::ModuleBase&) override {
    if (epoch_end) epoch_end(t);
  }
};

}  // namespace fulgor::testing
