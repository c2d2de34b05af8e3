// fulgor's Adam, AdamW and SGD with foreach and fused steps: against
// LibTorch's torch::optim step, against torch.optim's own foreach and fused
// steps (step_kernels_reference.py, run by Debian's python3-torch), across a
// save and load, and from configure_optimizers in a fit.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../support/python_reference.h"
#include "../support/tiny.h"
#include "fulgor/detail/compat.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

using Json = nlohmann::json;
using KernelMake = std::function<std::shared_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>, StepKernels)>;

// LibTorch 2.4 and later have CPU kernels for the three fused steps; earlier
// ones have none (1.13: _fused_adam_ for CUDA alone).
constexpr bool kCpuFused = FULGOR_TORCH_AT_LEAST(2, 4);

// step_kernels_reference.py's parameters and gradients.
std::vector<torch::Tensor> kernel_params(torch::Dtype dtype = torch::kFloat64) {
  std::vector<torch::Tensor> out;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 4}, std::vector<int64_t>{5}}) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    out.push_back(torch::cos(torch::arange(n, torch::kFloat64) * 0.11).reshape(shape).to(dtype).requires_grad_());
  }
  return out;
}

torch::Tensor kernel_gradient(const torch::Tensor& p, int64_t k) {
  const auto index = torch::arange(p.numel(), p.options().requires_grad(false)).reshape(p.sizes());
  return p.detach() * 0.3 + torch::sin(index * 0.37 + static_cast<double>(k));
}

void kernel_train(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params, int64_t from,
                  int64_t to) {
  for (int64_t k = from; k < to; ++k) {
    for (const auto& p : params) p.mutable_grad() = kernel_gradient(p, k);
    optimizer.step();
  }
}

struct KernelCase {
  std::string name;
  KernelMake fulgor;                                                                          // fulgor's, with kernels
  std::function<std::shared_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)> torch;  // LibTorch's
};

std::vector<KernelCase> kernel_cases() {
  using torch::optim::AdamOptions;
  using torch::optim::AdamWOptions;
  using torch::optim::SGDOptions;
  auto adam = [](AdamOptions o) {
    return KernelCase{"", [o](auto ps, StepKernels k) { return std::make_shared<Adam>(ps, o, k); },
                      [o](auto ps) { return std::make_shared<torch::optim::Adam>(ps, o); }};
  };
  auto adamw = [](AdamWOptions o) {
    return KernelCase{"", [o](auto ps, StepKernels k) { return std::make_shared<AdamW>(ps, o, k); },
                      [o](auto ps) { return std::make_shared<torch::optim::AdamW>(ps, o); }};
  };
  auto sgd = [](SGDOptions o) {
    return KernelCase{"", [o](auto ps, StepKernels k) { return std::make_shared<SGD>(ps, o, k); },
                      [o](auto ps) { return std::make_shared<torch::optim::SGD>(ps, o); }};
  };
  std::vector<std::pair<std::string, KernelCase>> named{
      {"adam", adam(AdamOptions(0.01).betas(std::make_tuple(0.9, 0.99)).eps(1e-8).weight_decay(0.1))},
      {"adam_amsgrad", adam(AdamOptions(0.01).amsgrad(true))},
      {"adamw", adamw(AdamWOptions(0.01).weight_decay(0.05).amsgrad(true))},
      {"sgd", sgd(SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01))},
      {"sgd_nesterov", sgd(SGDOptions(0.1).momentum(0.9).nesterov(true))},
      {"sgd_plain", sgd(SGDOptions(0.1))}};
  std::vector<KernelCase> out;
  for (auto& [name, c] : named) {
    c.name = name;
    out.push_back(c);
  }
  return out;
}

StepKernels foreach_kernels() {
  StepKernels k;
  k.foreach = true;
  return k;
}
StepKernels fused_kernels() {
  StepKernels k;
  k.fused = true;
  return k;
}

// The state tensors of `param`, by torch.optim's names.
std::map<std::string, torch::Tensor> kernel_state(const torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  std::map<std::string, torch::Tensor> out;
  const auto* state = detail::compat::optimizer_param_state(optimizer, p);
  if (!state) return out;
  if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
    out["momentum_buffer"] = s->momentum_buffer();
    return out;
  }
  auto fill = [&](const auto& s) {
    out["exp_avg"] = s.exp_avg();
    out["exp_avg_sq"] = s.exp_avg_sq();
    if (s.max_exp_avg_sq().defined()) out["max_exp_avg_sq"] = s.max_exp_avg_sq();
  };
  if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(state))
    fill(*s);
  else
    fill(dynamic_cast<const torch::optim::AdamParamState&>(*state));
  return out;
}

void expect_kernel_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double diff = (actual.to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(actual.to(torch::kFloat64), expected.to(torch::kFloat64), rtol, atol))
      << what << ": largest difference " << diff;
}

// Six steps of fulgor's optimizer with `kernels` against six of LibTorch's.
void expect_kernels_as_libtorch(const KernelCase& c, StepKernels kernels, torch::Dtype dtype, double rtol,
                                double atol) {
  auto ours = kernel_params(dtype), theirs = kernel_params(dtype);
  auto ours_opt = c.fulgor(ours, kernels);
  auto theirs_opt = c.torch(theirs);
  kernel_train(*ours_opt, ours, 0, 6);
  kernel_train(*theirs_opt, theirs, 0, 6);
  for (size_t i = 0; i < ours.size(); ++i) {
    expect_kernel_close(ours[i], theirs[i], rtol, atol, c.name + " parameter " + std::to_string(i));
    const auto expected = kernel_state(*theirs_opt, theirs[i]);
    const auto actual = kernel_state(*ours_opt, ours[i]);
    ASSERT_EQ(actual.size(), expected.size()) << c.name;
    for (const auto& [key, value] : expected)
      expect_kernel_close(actual.at(key), value, rtol, atol, c.name + " " + key + " of parameter " + std::to_string(i));
  }
}

TEST(StepKernels, ForeachStepsAsLibTorch) {
  for (const auto& c : kernel_cases()) {
    expect_kernels_as_libtorch(c, foreach_kernels(), torch::kFloat64, 1e-12, 1e-14);
    expect_kernels_as_libtorch(c, foreach_kernels(), torch::kFloat32, 1e-5, 1e-7);
  }
}

TEST(StepKernels, FusedStepsAsLibTorchOrSaysTheKernelIsMissing) {
  for (const auto& c : kernel_cases()) {
    if (kCpuFused) {
      expect_kernels_as_libtorch(c, fused_kernels(), torch::kFloat64, 1e-12, 1e-14);
      expect_kernels_as_libtorch(c, fused_kernels(), torch::kFloat32, 1e-5, 1e-7);
      continue;
    }
    auto params = kernel_params();
    auto optimizer = c.fulgor(params, fused_kernels());
    try {
      kernel_train(*optimizer, params, 0, 1);
      ADD_FAILURE() << c.name << ": a fused step on the CPU ran on LibTorch " << TORCH_VERSION;
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("has no fused kernel"), std::string::npos) << c.name;
      EXPECT_NE(std::string(e.what()).find("for device cpu"), std::string::npos) << c.name;
    }
    // The refused step changed nothing: the parameters and the state are as they were.
    EXPECT_TRUE(torch::equal(params[0], kernel_params()[0])) << c.name;
    EXPECT_TRUE(kernel_state(*optimizer, params[0]).empty()) << c.name;
  }
}

TEST(StepKernels, AsTorchOptim) {
  const Json reference = test::python_reference(FULGOR_PYTHON_TORCH, FULGOR_STEP_KERNELS_REFERENCE, "step_kernels");
  for (const auto& c : kernel_cases()) {
    const Json& expected = reference.at(c.name);
    std::vector<std::pair<std::string, StepKernels>> paths{{"foreach", foreach_kernels()}};
    if (kCpuFused) paths.emplace_back("fused", fused_kernels());
    for (const auto& [path, kernels] : paths) {
      ASSERT_TRUE(expected.contains(path)) << "torch " << reference.at("torch") << " ran no " << path << " " << c.name;
      auto params = kernel_params();
      auto optimizer = c.fulgor(params, kernels);
      kernel_train(*optimizer, params, 0, 6);
      const std::string what = c.name + " (" + path + ")";
      for (size_t i = 0; i < params.size(); ++i) {
        const Json& theirs = expected.at(path);
        auto as_tensor = [&](const Json& values) {
          return torch::tensor(values.get<std::vector<double>>(), torch::kFloat64).reshape(params[i].sizes());
        };
        expect_kernel_close(params[i], as_tensor(theirs.at("params").at(i)), 1e-12, 1e-14, what + " parameter");
        const auto state = kernel_state(*optimizer, params[i]);
        ASSERT_EQ(state.size(), theirs.at("state").at(i).size()) << what;
        for (const auto& [key, value] : theirs.at("state").at(i).items())
          expect_kernel_close(state.at(key), as_tensor(value), 1e-12, 1e-14, what + " " + key);
      }
    }
  }
}

TEST(StepKernels, ResumeExactlyAfterSaveAndLoad) {
  std::vector<StepKernels> all{foreach_kernels()};
  if (kCpuFused) all.push_back(fused_kernels());
  for (const auto& c : kernel_cases()) {
    for (const auto& kernels : all) {
      auto straight = kernel_params();
      auto straight_opt = c.fulgor(straight, kernels);
      kernel_train(*straight_opt, straight, 0, 5);

      auto first = kernel_params();
      auto first_opt = c.fulgor(first, kernels);
      kernel_train(*first_opt, first, 0, 3);
      std::stringstream saved;
      torch::save(*first_opt, saved);
      auto resumed = kernel_params();
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < resumed.size(); ++i) resumed[i].copy_(first[i]);
      }
      auto resumed_opt = c.fulgor(resumed, kernels);
      torch::load(*resumed_opt, saved);
      kernel_train(*resumed_opt, resumed, 3, 5);
      for (size_t i = 0; i < straight.size(); ++i)
        EXPECT_TRUE(torch::equal(resumed[i], straight[i])) << c.name << (kernels.fused ? " fused" : " foreach");
    }
  }
}

TEST(StepKernels, RefusesFusedAndForeachTogether) {
  StepKernels both;
  both.fused = true;
  both.foreach = true;
  for (const auto& c : kernel_cases()) {
    try {
      c.fulgor(kernel_params(), both);
      ADD_FAILURE() << c.name << " took fused and foreach together";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("fused=true and foreach=true together"), std::string::npos) << c.name;
    }
  }
}

TEST(StepKernels, OnTheCpuByDefaultStepsAsLibTorchBitForBit) {
  // On the CPU the default is LibTorch's own step, bit for bit.
  auto ours = kernel_params(), theirs = kernel_params();
  Adam adam(ours, torch::optim::AdamOptions(0.01));
  torch::optim::Adam reference(theirs, torch::optim::AdamOptions(0.01));
  kernel_train(adam, ours, 0, 4);
  kernel_train(reference, theirs, 0, 4);
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(torch::equal(ours[i], theirs[i]));
  EXPECT_FALSE(adam.kernels().foreach.has_value());
}

// fulgor's Adam from configure_optimizers, fused where this LibTorch can, in a
// fit resumed from a checkpoint after two epochs of four.
std::unique_ptr<TinyNet> kernel_adam_net() {
  torch::manual_seed(3);
  auto model = std::make_unique<TinyNet>();
  model->make_optimizers = [](TinyNet& m) -> OptimizerConfig {
    return std::make_shared<Adam>(m.parameters(), torch::optim::AdamOptions(0.01),
                                  kCpuFused ? fused_kernels() : foreach_kernels());
  };
  return model;
}

TEST(StepKernels, FitResumesExactlyFromACheckpoint) {
  TempDir dir;
  auto train = shuffled_loader(36, 8);
  auto straight = kernel_adam_net();
  torch::manual_seed(99);
  Trainer(quiet(dir, 4)).fit(*straight, train);

  auto first = kernel_adam_net();
  torch::manual_seed(99);
  Trainer two(quiet(dir, 2));
  two.fit(*first, train);
  const std::string path = (dir.path / "two.ckpt").string();
  two.save_checkpoint(path);
  auto resumed = kernel_adam_net();
  Trainer more(quiet(dir, 4));
  FitOptions fit_options;
  fit_options.ckpt_path = path;
  more.fit(*resumed, train, fit_options);
  EXPECT_TRUE(same_parameters(*resumed, *straight));
  EXPECT_FALSE(same_parameters(*resumed, *first));
}

TEST(StepKernels, ExportedAsTorchOptimNamesThem) {
  auto params = kernel_params();
  Adam adam(params, torch::optim::AdamOptions(0.01), foreach_kernels());
  kernel_train(adam, params, 0, 2);
  const auto exported = export_optimizer_state(adam).toGenericDict();
  const auto group = exported.at("param_groups").toListRef()[0].toGenericDict();
  EXPECT_TRUE(group.at("foreach").toBool());
  EXPECT_FALSE(group.at("fused").toBool());
  const auto state = exported.at("state").toGenericDict().at(0).toGenericDict();
  EXPECT_EQ(state.at("step").toTensor().item<double>(), 2.0);

  SGD sgd(kernel_params(), torch::optim::SGDOptions(0.1), fused_kernels());
  const auto sgd_group = export_optimizer_state(sgd).toGenericDict().at("param_groups").toListRef()[0].toGenericDict();
  EXPECT_TRUE(sgd_group.at("fused").toBool());
  EXPECT_TRUE(sgd_group.at("foreach").isNone());
}

}  // namespace
}  // namespace fulgor::testing
