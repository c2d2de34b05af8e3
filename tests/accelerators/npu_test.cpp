// The built-in npu accelerator on the emulated NPU runtime (PrivateUse1 named
// "npu"), which it loads through FULGOR_NPU_LIBRARY as it would load Ascend's.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "emulated_runtimes.h"
#include "fulgor/core/batch.h"
#include "fulgor/detail/compat.h"
#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

using testing::kNpu0;
using testing::kNpu1;

class NpuAccelerator : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!detail::compat::kHasNamedPrivateUse1)
      GTEST_SKIP() << "the npu accelerator needs LibTorch >= 2.1, where PrivateUse1 can be named \"npu\"; this is "
                   << TORCH_VERSION;
    npu_ = make_accelerator("npu");
  }
  std::unique_ptr<Accelerator> npu_;
};

TEST_F(NpuAccelerator, IsAvailableOnTheEmulatedRuntime) {
  const Availability availability = npu_->availability();
  EXPECT_TRUE(availability.available) << availability.reason;
  EXPECT_EQ(kNpu1.str(), "npu:1");
}

TEST_F(NpuAccelerator, CountsTheDevicesTheRuntimeHas) {
  const int64_t count = testing::emulated_device_count();
  EXPECT_EQ(npu_->device_count(), count);
  EXPECT_EQ(npu_->parse_devices("auto").size(), static_cast<size_t>(count));
  EXPECT_EQ(npu_->parse_devices("1,"), std::vector<torch::Device>{kNpu1});
  EXPECT_EQ(npu_->parse_devices(std::vector<int64_t>{1, 0}), (std::vector<torch::Device>{kNpu1, kNpu0}));
  EXPECT_THROW(npu_->parse_devices(count + 1), ConfigError);
}

// torch::nn::Module::to cannot move parameters to PrivateUse1 (set_data
// refuses a TensorImpl of another type); Accelerator::move_module must.
TEST_F(NpuAccelerator, MovesEveryParameterAndBufferInPlaceWhereModuleToCannot) {
  torch::nn::Sequential model = testing::mlp_with_buffers();
  EXPECT_ANY_THROW(model->clone()->to(kNpu1));

  const std::vector<torch::Tensor> before = testing::parameters_and_buffers(*model);
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& tensor : before) values.push_back(tensor.detach().clone());
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));

  npu_->move_module(*model, kNpu1);

  const std::vector<torch::Tensor> after = testing::parameters_and_buffers(*model);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].device(), kNpu1) << "tensor " << i;
    EXPECT_EQ(after[i].unsafeGetTensorImpl(), before[i].unsafeGetTensorImpl()) << "tensor " << i;
    EXPECT_TRUE(torch::equal(after[i].cpu(), values[i])) << "tensor " << i;
  }
  // The optimizer made before the move trains the moved parameters.
  optimizer.zero_grad();
  model->forward(torch::randn({5, 4}).to(kNpu1)).sum().backward();
  optimizer.step();
  for (const torch::Tensor& parameter : model->parameters()) {
    EXPECT_EQ(parameter.device(), kNpu1);
    EXPECT_EQ(parameter.grad().device(), kNpu1);
  }
  EXPECT_FALSE(torch::equal(model->parameters()[0].cpu(), values[0]));
}

TEST_F(NpuAccelerator, MovesBatches) {
  const torch::Tensor x = torch::randn({3, 4});
  auto example = move_batch(torch::data::Example<>(x, torch::arange(3)), *npu_, kNpu1);
  EXPECT_EQ(example.data.device(), kNpu1);
  EXPECT_EQ(example.target.device(), kNpu1);
  EXPECT_TRUE(torch::equal(example.data.cpu(), x));
}

TEST_F(NpuAccelerator, SetupDeviceMakesItCurrentAndSynchronizes) {
  npu_->setup_device({kNpu1});
  EXPECT_EQ(torch::empty({2}, torch::Device(torch::DeviceType::PrivateUse1)).device(), kNpu1);
  npu_->synchronize(kNpu1);
  npu_->setup_device({kNpu0});
  EXPECT_EQ(torch::empty({2}, torch::Device(torch::DeviceType::PrivateUse1)).device(), kNpu0);
}

// The NPU runtime gives every device a generator of its own.
TEST_F(NpuAccelerator, RngStateRoundTripsPerDevice) {
  const torch::Tensor state = npu_->get_rng_state(kNpu1);
  ASSERT_TRUE(state.defined());
  const torch::Tensor other_device = npu_->get_rng_state(kNpu0);
  const torch::Tensor first = torch::rand({8}, torch::TensorOptions().device(kNpu1)).cpu();
  EXPECT_FALSE(torch::equal(npu_->get_rng_state(kNpu1), state));
  EXPECT_TRUE(torch::equal(npu_->get_rng_state(kNpu0), other_device)) << "drawing on npu:1 moved npu:0's generator";

  npu_->set_rng_state(kNpu1, state);
  EXPECT_TRUE(torch::equal(torch::rand({8}, torch::TensorOptions().device(kNpu1)).cpu(), first));
}

TEST_F(NpuAccelerator, MemoryStatsAreCallable) {
  for (const auto& [name, value] : npu_->memory_stats(kNpu1)) EXPECT_GE(value, 0) << name;
}

// With the emulated XPU runtime in the same process, "auto" keeps to the
// priorities: xpu (300) over npu (200) over cpu (0).
TEST_F(NpuAccelerator, RanksBelowXpuInAutoSelection) {
  auto& registry = AcceleratorRegistry::instance();
  if (registry.create("cuda")->is_available()) GTEST_SKIP() << "CUDA is available here and outranks both";
  ASSERT_TRUE(npu_->is_available());
  EXPECT_EQ(registry.resolve("auto"), "xpu");
  std::vector<std::string> order;
  for (const AcceleratorInfo& info : registry.describe())
    if (info.available) order.push_back(info.name);
  EXPECT_EQ(order, (std::vector<std::string>{"xpu", "npu", "cpu"}));
}

}  // namespace
}  // namespace fulgor
