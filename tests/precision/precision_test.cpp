#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fulgor/core/error.h"
#include "fulgor/precision/precision.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

TEST(Precision, ParsesNamesAndAliases) {
  auto cpu = make_accelerator("cpu");
  EXPECT_EQ(Precision::parse("32", *cpu).name, "32-true");
  EXPECT_EQ(Precision::parse("bf16", *cpu).name, "bf16-mixed");
  Precision bf16 = Precision::parse("bf16-mixed", *cpu);
  EXPECT_TRUE(bf16.mixed);
  EXPECT_EQ(bf16.dtype, torch::kBFloat16);
  EXPECT_FALSE(bf16.needs_grad_scaler());
  EXPECT_TRUE(Precision::parse("bf16-true", *cpu).converts_module());
  EXPECT_FALSE(Precision::parse("32-true", *cpu).converts_module());
}

TEST(Precision, UnknownValuesListTheKnownOnes) {
  auto cpu = make_accelerator("cpu");
  try {
    Precision::parse("fp8", *cpu);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("precision 'fp8' is not known; accepted: 32-true, 64-true, bf16-mixed, "
                                         "16-mixed, bf16-true, 16-true"),
              std::string::npos)
        << e.what();
  }
}

TEST(Precision, UnsupportedOnTheAcceleratorNamesWhatItSupports) {
  auto cpu = make_accelerator("cpu");
  try {
    Precision::parse("16-mixed", *cpu);
    FAIL();
  } catch (const DeviceError& e) {
    EXPECT_EQ(std::string(e.what()),
              "precision '16-mixed' is not supported by accelerator 'cpu'; it supports: 32-true, 64-true, "
              "bf16-mixed, bf16-true");
  }
}

TEST(AutocastScope, RunsMatmulsInBfloat16AndRestores) {
  auto cpu = make_accelerator("cpu");
  torch::nn::Linear linear(8, 4);
  auto x = torch::randn({2, 8});
  {
    AutocastScope scope(Precision::parse("bf16-mixed", *cpu), *cpu);
    EXPECT_EQ(linear->forward(x).scalar_type(), torch::kBFloat16);
    // Parameters stay in float32: only the computation is cast.
    EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat);
  }
  EXPECT_EQ(linear->forward(x).scalar_type(), torch::kFloat);
  {
    AutocastScope off(Precision::parse("32-true", *cpu), *cpu);
    EXPECT_EQ(linear->forward(x).scalar_type(), torch::kFloat);
  }
}

TEST(Precision, TrueHalfConvertsParametersAndInputs) {
  auto cpu = make_accelerator("cpu");
  torch::nn::Linear linear(3, 2);
  Precision precision = Precision::parse("bf16-true", *cpu);
  precision.convert_module(*linear);
  for (const auto& p : linear->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(precision.convert_input(torch::ones({1, 3})).scalar_type(), torch::kBFloat16);
  EXPECT_EQ(precision.convert_input(torch::ones({1}, torch::kLong)).scalar_type(), torch::kLong);
  EXPECT_EQ(linear->forward(precision.convert_input(torch::ones({1, 3}))).scalar_type(), torch::kBFloat16);
}

// One parameter whose gradient the test sets directly.
struct ScalerFixture {
  torch::Tensor weight = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD optimizer{{weight}, torch::optim::SGDOptions(1.0)};
  void set_grad(const torch::Tensor& grad) { weight.mutable_grad() = grad.clone(); }
};

TEST(GradScaler, UnscalesAndSteps) {
  ScalerFixture f;
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.scale(torch::tensor(2.0f)).item<float>(), 131072.0f);
  f.set_grad(torch::full({2}, 65536.0f));  // a scaled gradient of 1
  EXPECT_TRUE(scaler.step(f.optimizer));
  scaler.update();
  EXPECT_TRUE(torch::allclose(f.weight, torch::zeros({2})));  // 1 - lr * 1
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

TEST(GradScaler, SkipsANonFiniteStepAndBacksOff) {
  ScalerFixture f;
  GradScaler scaler;
  f.set_grad(torch::tensor({1.0f, std::numeric_limits<float>::infinity()}));
  scaler.unscale(f.optimizer);  // explicit, as before clipping
  EXPECT_FALSE(scaler.step(f.optimizer));
  scaler.update();
  EXPECT_TRUE(torch::equal(f.weight, torch::ones({2}))) << "the optimizer stepped on an inf gradient";
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  f.set_grad(torch::tensor({std::nanf(""), 0.0f}));
  EXPECT_FALSE(scaler.step(f.optimizer));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 16384.0);
}

TEST(GradScaler, GrowsAfterTheIntervalAndStateRoundTrips) {
  ScalerFixture f;
  GradScalerOptions options;
  options.growth_interval = 3;
  GradScaler scaler(options);
  for (int i = 0; i < 3; ++i) {
    f.set_grad(torch::ones({2}));
    EXPECT_TRUE(scaler.step(f.optimizer));
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 131072.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  f.set_grad(torch::ones({2}));
  scaler.step(f.optimizer);
  scaler.update();

  torch::serialize::OutputArchive out;
  scaler.save(out);
  std::stringstream buffer;
  out.save_to(buffer);
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  GradScaler restored(options);
  restored.load(in);
  EXPECT_EQ(restored.get_scale(), 131072.0);
  EXPECT_EQ(restored.growth_tracker(), 1);
}

TEST(GradScaler, RejectsBadOptions) {
  GradScalerOptions options;
  options.backoff_factor = 1.5;
  EXPECT_THROW(GradScaler{options}, ConfigError);
}

}  // namespace
}  // namespace fulgor
