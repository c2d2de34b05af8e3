// The Trainer's precisions: autocast around the steps, the GradScaler of
// "16-mixed" in the loop and in checkpoints, the "-true" conversions.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "../support/fp16_cpu.h"
#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace {

using fulgor::testing::quiet;
using fulgor::testing::TempDir;

// The CPU claiming "16-mixed", with its own autocast, so that the Trainer's
// GradScaler path runs on a machine without a GPU.
void register_fp16_accelerator() { fulgor::test::register_fp16_cpu("fp16_test_cpu", torch::kCPU); }

// Records the dtypes seen inside training_step.
struct DtypeProbe : fulgor::testing::TinyNet {
  torch::ScalarType matmul_dtype = torch::kFloat, input_dtype = torch::kFloat;
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    input_dtype = batch.data.scalar_type();
    auto hidden = l1(batch.data);
    matmul_dtype = hidden.scalar_type();
    // In float: LibTorch 1.13 has no bfloat16 mse_loss on the CPU.
    return torch::mse_loss(l2(torch::tanh(hidden)).to(torch::kFloat), batch.target.to(torch::kFloat));
  }
  // Read before the step: optimizers may clear gradients to undefined afterwards.
  std::vector<torch::ScalarType> grad_dtypes;
  void on_before_optimizer_step(torch::optim::Optimizer&) override {
    for (const auto& p : parameters())
      if (p.grad().defined()) grad_dtypes.push_back(p.grad().scalar_type());
  }
};

// Why float16 autocast cannot run on the CPU with this LibTorch (1.13 allows
// only bfloat16 there), or "" when it can.
std::string cpu_fp16_autocast_unavailable() {
  fulgor::test::Fp16Cpu accelerator(torch::kCPU);
  try {
    fulgor::AutocastScope scope(fulgor::Precision::parse("16-mixed", accelerator), accelerator);
    torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return {};
}

TEST(TrainerPrecision, Bf16MixedRunsMatmulsInBf16WithFloat32Parameters) {
  TempDir dir;
  auto options = quiet(dir.str());
  options.precision = "bf16-mixed";
  options.max_epochs = 1;
  options.limit_train_batches = 2;
  fulgor::Trainer trainer(options);
  DtypeProbe model;
  auto loader = fulgor::testing::sequential_loader(32, 8);
  trainer.fit(model, loader);
  EXPECT_EQ(trainer.precision().name, "bf16-mixed");
  EXPECT_EQ(model.matmul_dtype, torch::kBFloat16);
  EXPECT_EQ(model.input_dtype, torch::kFloat);
  for (const auto& p : model.parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
  // Every parameter had a float32 gradient at each of the two steps.
  EXPECT_EQ(model.grad_dtypes.size(), 2 * model.parameters().size());
  for (torch::ScalarType dtype : model.grad_dtypes) EXPECT_EQ(dtype, torch::kFloat);
  // Autocast is off again outside the step.
  EXPECT_EQ(model.l1(torch::ones({1, 4})).scalar_type(), torch::kFloat);
}

TEST(TrainerPrecision, Bf16TrueConvertsParametersAndInputs) {
  TempDir dir;
  auto options = quiet(dir.str());
  options.precision = "bf16-true";
  options.max_epochs = 1;
  options.limit_train_batches = 2;
  fulgor::Trainer trainer(options);
  DtypeProbe model;
  auto loader = fulgor::testing::sequential_loader(32, 8);
  trainer.fit(model, loader);
  EXPECT_EQ(model.input_dtype, torch::kBFloat16);
  EXPECT_EQ(model.matmul_dtype, torch::kBFloat16);
  for (const auto& p : model.parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
}

TEST(TrainerPrecision, UnsupportedPrecisionsFailNamingTheAccelerator) {
  TempDir dir;
  auto options = quiet(dir.str());
  options.max_epochs = 1;
  options.precision = "16-mixed";  // Lightning refuses fp16 AMP on the CPU too
  fulgor::testing::TinyNet model;
  auto loader = fulgor::testing::sequential_loader(8, 4);
  try {
    fulgor::Trainer(options).fit(model, loader);
    FAIL() << "16-mixed on the CPU was accepted";
  } catch (const fulgor::DeviceError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("16-mixed"), std::string::npos) << message;
    EXPECT_NE(message.find("'cpu'"), std::string::npos) << message;
    EXPECT_NE(message.find("bf16-mixed"), std::string::npos) << message;
  }
  options.precision = "8-true";
  try {
    fulgor::Trainer(options).fit(model, loader);
    FAIL() << "an unknown precision was accepted";
  } catch (const fulgor::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("8-true"), std::string::npos) << e.what();
  }
}

// Three Gaussian blobs in 8 dimensions, with some overlap.
struct Blobs : torch::data::datasets::Dataset<Blobs> {
  torch::Tensor x, y;
  Blobs(int64_t n, uint64_t seed) {
    auto g = at::detail::createCPUGenerator(seed);
    auto centers = torch::randn({3, 8}, at::detail::createCPUGenerator(1)) * 1.5;
    y = torch::randint(0, 3, {n}, g);
    x = centers.index_select(0, y) + torch::randn({n, 8}, g);
  }
  torch::data::Example<> get(size_t i) override { return {x[static_cast<int64_t>(i)], y[static_cast<int64_t>(i)]}; }
  c10::optional<size_t> size() const override { return static_cast<size_t>(x.size(0)); }
};

auto blob_loader(int64_t n, uint64_t seed) {
  return fulgor::make_data_loader<torch::data::samplers::SequentialSampler>(
      Blobs(n, seed).map(torch::data::transforms::Stack<>()), 50);
}

struct Mlp : fulgor::Module {
  torch::nn::Sequential net;
  Mlp() {
    net = register_module("net",
                          torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 3)));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::cross_entropy_loss(net->forward(batch.data).to(torch::kFloat), batch.target);
  }
  void test_step(torch::data::Example<> batch, int64_t) override {
    auto correct = net->forward(batch.data).argmax(1).eq(batch.target).to(torch::kFloat).mean();
    log("acc", correct);
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2));
  }
};

double blob_accuracy(const std::string& precision) {
  TempDir dir;
  auto options = quiet(dir.str());
  options.precision = precision;
  options.max_epochs = 5;
  options.seed = 3;
  fulgor::Trainer trainer(options);
  torch::manual_seed(3);
  Mlp model;
  auto train = blob_loader(1000, 11);
  auto test = blob_loader(500, 12);
  trainer.fit(model, train);
  return trainer.test(model, test).at("acc");
}

TEST(TrainerPrecision, Bf16MixedTrainsAsWellAsFloat32) {
  const double fp32 = blob_accuracy("32-true");
  const double bf16 = blob_accuracy("bf16-mixed");
  EXPECT_GT(fp32, 0.8);  // the task is learnable, so the comparison means something
  EXPECT_NEAR(bf16, fp32, 0.01);
}

// w * x stays in float32 under autocast (elementwise ops are not cast), so
// this runs on every LibTorch's CPU kernels; the injected gradients decide
// which steps the scaler skips.
struct ScaledNet : fulgor::Module {
  torch::Tensor w;
  std::vector<int64_t> poison_steps;
  int64_t backward_calls = 0;
  ScaledNet() { w = register_parameter("w", torch::ones({4})); }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return ((batch.data * w).sum(1, true) - batch.target).pow(2).mean();
  }
  void on_after_backward() override {
    if (std::find(poison_steps.begin(), poison_steps.end(), backward_calls++) != poison_steps.end()) {
      torch::NoGradGuard no_grad;
      w.mutable_grad()[0] = std::numeric_limits<float>::infinity();
    }
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01));
  }
};

TEST(TrainerPrecision, SixteenMixedSkipsAnInfStepAndBacksOff) {
  if (auto why = cpu_fp16_autocast_unavailable(); !why.empty()) GTEST_SKIP() << why;
  register_fp16_accelerator();
  TempDir dir;
  auto options = quiet(dir.str());
  options.accelerator = "fp16_test_cpu";
  options.precision = "16";
  options.max_epochs = 1;
  options.gradient_clip_val = 1.0;  // clipping must see unscaled, finite gradients
  fulgor::Trainer trainer(options);
  ScaledNet model;
  model.poison_steps = {1};
  std::vector<torch::Tensor> weights;
  std::vector<double> scales;
  auto loader = fulgor::testing::sequential_loader(16, 4);
  struct Recorder : fulgor::Callback {
    ScaledNet* model;
    std::vector<torch::Tensor>* weights;
    std::vector<double>* scales;
    void on_train_batch_end(fulgor::Trainer& t, fulgor::ModuleBase&, const torch::Tensor&, int64_t) override {
      weights->push_back(model->w.detach().clone());
      scales->push_back(t.grad_scaler()->get_scale());
    }
  };
  auto recorder = std::make_shared<Recorder>();
  recorder->model = &model;
  recorder->weights = &weights;
  recorder->scales = &scales;
  options.callbacks = {recorder};
  fulgor::Trainer recorded(options);
  const auto result = recorded.fit(model, loader);
  ASSERT_NE(recorded.grad_scaler(), nullptr);
  ASSERT_EQ(weights.size(), 4u);
  const double init = fulgor::GradScalerOptions{}.init_scale;
  EXPECT_EQ(scales[0], init);
  EXPECT_EQ(scales[1], init / 2);                     // the inf step backs off...
  EXPECT_TRUE(torch::equal(weights[1], weights[0]));  // ...and leaves the weights alone
  EXPECT_FALSE(torch::equal(weights[2], weights[1]));
  for (const auto& w : weights) EXPECT_TRUE(torch::isfinite(w).all().item<bool>());
  EXPECT_EQ(scales[3], init / 2);
  // As in Lightning, the skipped step still counts.
  EXPECT_EQ(result.global_step, 4);
  EXPECT_EQ(trainer.grad_scaler(), nullptr);  // no loop has run in this one yet
}

TEST(TrainerPrecision, GradScalerStateRoundTripsACheckpoint) {
  if (auto why = cpu_fp16_autocast_unavailable(); !why.empty()) GTEST_SKIP() << why;
  register_fp16_accelerator();
  TempDir dir;
  auto options = quiet(dir.str());
  options.accelerator = "fp16_test_cpu";
  options.precision = "16-mixed";
  options.max_epochs = 1;
  auto loader = fulgor::testing::sequential_loader(16, 4);
  ScaledNet first;
  first.poison_steps = {0, 2};
  fulgor::Trainer trainer(options);
  trainer.fit(first, loader);
  const double saved_scale = trainer.grad_scaler()->get_scale();
  const int64_t saved_tracker = trainer.grad_scaler()->growth_tracker();
  ASSERT_EQ(saved_scale, fulgor::GradScalerOptions{}.init_scale / 4);
  ASSERT_EQ(saved_tracker, 1);
  const std::string path = (dir.path / "scaler.ckpt").string();
  trainer.save_checkpoint(path);

  // A fresh Trainer resumes into a second epoch with the saved scale.
  options.max_epochs = 2;
  ScaledNet second;
  second.poison_steps = {0};
  fulgor::Trainer resumed(options);
  auto resume_from = [](const std::string& checkpoint) {
    fulgor::FitOptions fit;
    fit.ckpt_path = checkpoint;
    return fit;
  };
  resumed.fit(second, loader, resume_from(path));
  // One backoff from the restored scale; the three good steps after it restart the tracker.
  EXPECT_EQ(resumed.grad_scaler()->get_scale(), saved_scale / 2);
  EXPECT_EQ(resumed.grad_scaler()->growth_tracker(), 3);
}

}  // namespace
