// The built-in xpu accelerator on the emulated XPU runtime, which it loads
// through FULGOR_XPU_LIBRARY exactly as it would load Intel's.
//
// Under ctest every test runs in a process of its own, so each also shows that
// the accelerator loads its runtime on first use, whichever method comes first.

#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "emulated_runtimes.h"
#include "fulgor/core/batch.h"
#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

using testing::kXpu1;

TEST(XpuAccelerator, IsAvailableOnTheEmulatedRuntime) {
  auto xpu = make_accelerator("xpu");
  const Availability availability = xpu->availability();
  EXPECT_TRUE(availability.available) << availability.reason;
  EXPECT_EQ(availability.reason, "");
  EXPECT_EQ(xpu->name(), "xpu");
}

TEST(XpuAccelerator, CountsTheDevicesTheRuntimeHas) {
  auto xpu = make_accelerator("xpu");
  const int64_t count = testing::emulated_device_count();
  EXPECT_EQ(xpu->device_count(), count);
  EXPECT_EQ(xpu->auto_device_count(), count);
  std::vector<torch::Device> all;
  for (int64_t i = 0; i < count; ++i) all.emplace_back(torch::kXPU, static_cast<torch::DeviceIndex>(i));
  EXPECT_EQ(xpu->parse_devices("auto"), all);
  EXPECT_EQ(xpu->parse_devices(-1), all);
}

TEST(XpuAccelerator, ParsesDevicesByIndex) {
  auto xpu = make_accelerator("xpu");
  EXPECT_EQ(xpu->parse_devices("1,"), std::vector<torch::Device>{kXpu1});
  EXPECT_EQ(xpu->parse_devices({1, 0}), (std::vector<torch::Device>{kXpu1, torch::Device(torch::kXPU, 0)}));
  EXPECT_EQ(xpu->parse_devices(2), (std::vector<torch::Device>{torch::Device(torch::kXPU, 0), kXpu1}));
  const int64_t count = testing::emulated_device_count();
  EXPECT_THROW(xpu->parse_devices(count + 1), ConfigError);
  EXPECT_THROW(xpu->parse_devices(std::vector<int64_t>{count}), ConfigError);
}

TEST(XpuAccelerator, MovesEveryParameterAndBufferInPlace) {
  auto xpu = make_accelerator("xpu");
  torch::nn::Sequential model = testing::mlp_with_buffers();
  const std::vector<torch::Tensor> before = testing::parameters_and_buffers(*model);
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& tensor : before) values.push_back(tensor.detach().clone());

  xpu->move_module(*model, kXpu1);

  const std::vector<torch::Tensor> after = testing::parameters_and_buffers(*model);
  ASSERT_EQ(after.size(), 9u);  // two Linear and a BatchNorm (weight, bias), and its three buffers
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].device(), kXpu1) << "tensor " << i;
    EXPECT_EQ(after[i].unsafeGetTensorImpl(), before[i].unsafeGetTensorImpl()) << "tensor " << i;
    EXPECT_TRUE(torch::equal(after[i].cpu(), values[i])) << "tensor " << i;
  }
  // The moved module computes there.
  EXPECT_EQ(model->forward(torch::randn({5, 4}).to(kXpu1)).device(), kXpu1);
}

TEST(XpuAccelerator, MovesBatches) {
  auto xpu = make_accelerator("xpu");
  const torch::Tensor x = torch::randn({3, 4});
  const torch::Tensor y = torch::arange(3);
  auto example = move_batch(torch::data::Example<>(x, y), *xpu, kXpu1);
  EXPECT_EQ(example.data.device(), kXpu1);
  EXPECT_TRUE(torch::equal(example.target.cpu(), y));
  auto nested = move_batch(
      std::make_tuple(std::vector<torch::Tensor>{x}, std::map<std::string, torch::Tensor>{{"y", y}}), *xpu, kXpu1);
  EXPECT_EQ(std::get<0>(nested).at(0).device(), kXpu1);
  EXPECT_EQ(std::get<1>(nested).at("y").device(), kXpu1);
}

TEST(XpuAccelerator, SetupDeviceMakesItCurrentAndSynchronizes) {
  auto xpu = make_accelerator("xpu");
  xpu->setup_device({kXpu1});
  // A tensor created without an index lands on the current device.
  EXPECT_EQ(torch::empty({2}, torch::Device(torch::kXPU)).device(), kXpu1);
  xpu->synchronize(kXpu1);
  xpu->setup_device({torch::Device(torch::kXPU, 0)});
  EXPECT_EQ(torch::empty({2}, torch::Device(torch::kXPU)).device(), torch::Device(torch::kXPU, 0));
}

// The emulated XPU, like an XPU without Intel's extension hooks, gives LibTorch
// no per-device generator: random operators on it draw from the CPU's.
TEST(XpuAccelerator, HasNoRngStateOfItsOwn) {
  auto xpu = make_accelerator("xpu");
  EXPECT_FALSE(xpu->get_rng_state(kXpu1).defined());
  EXPECT_NO_THROW(xpu->set_rng_state(kXpu1, torch::Tensor()));
  EXPECT_THROW(xpu->set_rng_state(kXpu1, torch::zeros({16}, torch::kByte)), DeviceError);
}

TEST(XpuAccelerator, MemoryStatsAreCallable) {
  auto xpu = make_accelerator("xpu");
  for (const auto& [name, value] : xpu->memory_stats(kXpu1)) EXPECT_GE(value, 0) << name;
}

TEST(XpuAccelerator, AutoAndGpuChooseItOverTheCpu) {
  auto& registry = AcceleratorRegistry::instance();
  if (registry.create("cuda")->is_available()) GTEST_SKIP() << "CUDA is available here and outranks xpu";
  EXPECT_EQ(registry.resolve("auto"), "xpu");
  EXPECT_EQ(registry.resolve("gpu"), "xpu");
  EXPECT_EQ(make_accelerator("auto")->device_type(), torch::kXPU);
}

}  // namespace
}  // namespace fulgor
