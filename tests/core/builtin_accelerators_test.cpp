// The built-in accelerators as a program sees them without naming any of them:
// nothing here refers to their classes, so these tests also prove that their
// load-time registrations survive linking.

#include <gtest/gtest.h>

#include <cstdlib>

#include "fulgor/detail/compat.h"
#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fulgor/core/runtime_info.h"

namespace fulgor {
namespace {

TEST(BuiltinAccelerators, AllFourAreRegistered) {
  EXPECT_EQ(AcceleratorRegistry::instance().names(), (std::vector<std::string>{"cpu", "cuda", "npu", "xpu"}));
}

// Note [BLAS threads]: setting up the CPU for a loop leaves OpenBLAS's
// pthreads build one thread, unless OPENBLAS_NUM_THREADS chose a count.
TEST(BuiltinAccelerators, CpuSetUpKeepsOpenBlasFromOversubscribingTheCores) {
  const BlasInfo before = blas_info();
  if (before.threading != "pthreads" || before.threads < 2)
    GTEST_SKIP() << "needs OpenBLAS's pthreads build with several threads; found " << before.name << " ("
                 << before.threading << ", " << before.threads << " threads)";
  auto cpu = make_accelerator("cpu");
  ::setenv("OPENBLAS_NUM_THREADS", "2", 1);
  cpu->setup_device({torch::Device(torch::kCPU)});
  EXPECT_EQ(blas_info().threads, before.threads);
  ::unsetenv("OPENBLAS_NUM_THREADS");
  cpu->setup_device({torch::Device(torch::kCPU)});
  EXPECT_EQ(blas_info().threads, 1);
  EXPECT_FALSE(limit_blas_threads());  // once is enough
}

TEST(BuiltinAccelerators, CpuIsAlwaysAvailable) {
  auto cpu = make_accelerator("cpu");
  EXPECT_TRUE(cpu->is_available());
  EXPECT_EQ(cpu->device_type(), torch::kCPU);
  EXPECT_EQ(cpu->distributed_backend(), "gloo");
  EXPECT_EQ(cpu->auto_device_count(), 1);
  EXPECT_EQ(cpu->parse_devices("auto"), std::vector<torch::Device>{torch::Device(torch::kCPU)});
  EXPECT_EQ(cpu->parse_devices(3).size(), 3u);
  EXPECT_THROW(cpu->parse_devices("0,1"), ConfigError);
  EXPECT_THROW(cpu->parse_devices(0), ConfigError);
  EXPECT_GT(cpu->memory_stats(torch::Device(torch::kCPU)).at("process_resident_bytes"), 0);
  EXPECT_EQ(cpu->name(), "cpu");
  cpu->synchronize(torch::Device(torch::kCPU));
}

// devices=9223372036854775807 once ended in std::length_error from building
// a vector of that many CPU devices, and 100000000000 in allocating one.
TEST(BuiltinAccelerators, CpuRefusesHugeProcessCounts) {
  auto cpu = make_accelerator("cpu");
  for (Devices devices : {Devices(int64_t{9223372036854775807}), Devices(int64_t{100000000000})}) {
    try {
      cpu->parse_devices(devices);
      ADD_FAILURE() << devices.str() << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("devices=" + devices.str()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("65536"), std::string::npos) << e.what();
    }
  }
}

TEST(BuiltinAccelerators, CpuRngStateRoundTrips) {
  auto cpu = make_accelerator("cpu");
  torch::manual_seed(7);
  torch::Tensor state = cpu->get_rng_state(torch::Device(torch::kCPU));
  ASSERT_TRUE(state.defined());
  torch::Tensor first = torch::rand({4});
  cpu->set_rng_state(torch::Device(torch::kCPU), state);
  EXPECT_TRUE(torch::equal(first, torch::rand({4})));
}

TEST(BuiltinAccelerators, CudaSaysWhyItIsUnavailable) {
  auto cuda = make_accelerator("cuda");
  EXPECT_EQ(cuda->device_type(), torch::kCUDA);
  if (cuda->is_available()) GTEST_SKIP() << "this machine has CUDA; covered by the conformance suite";
  EXPECT_EQ(cuda->availability().reason, "this LibTorch was built without CUDA");
  EXPECT_EQ(cuda->device_count(), 0);
  try {
    cuda->parse_devices(1);
    FAIL() << "devices were parsed on an unavailable accelerator";
  } catch (const DeviceError& e) {
    EXPECT_EQ(std::string(e.what()), "accelerator 'cuda' is not available: this LibTorch was built without CUDA");
  }
}

TEST(BuiltinAccelerators, XpuWithoutARuntimeSaysHowToGetOne) {
  ASSERT_EQ(std::getenv("FULGOR_XPU_LIBRARY"), nullptr);
  auto xpu = make_accelerator("xpu");
  EXPECT_EQ(xpu->device_type(), torch::kXPU);
  EXPECT_EQ(xpu->distributed_backend(), "xccl");
  EXPECT_FALSE(xpu->is_available());
  EXPECT_NE(xpu->availability().reason.find("FULGOR_XPU_LIBRARY"), std::string::npos);
}

TEST(BuiltinAccelerators, XpuNamesARuntimeLibraryThatDoesNotLoad) {
  setenv("FULGOR_XPU_LIBRARY", "/nonexistent/libxpu_runtime.so", 1);
  auto xpu = make_accelerator("xpu");
  std::string reason = xpu->availability().reason;
  unsetenv("FULGOR_XPU_LIBRARY");
  EXPECT_NE(reason.find("cannot load the runtime library '/nonexistent/libxpu_runtime.so' (from FULGOR_XPU_LIBRARY)"),
            std::string::npos)
      << reason;
}

// The CPU autocasts to bfloat16 only (as Lightning, which refuses 16-mixed on
// the CPU); the GPUs take both reduced types.
TEST(BuiltinAccelerators, PrecisionsAreTheirDevicesReducedTypes) {
  EXPECT_EQ(make_accelerator("cpu")->supported_precisions(),
            (std::vector<std::string>{"32-true", "64-true", "bf16-mixed", "bf16-true"}));
  const std::vector<std::string> both = {"32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"};
  for (const char* gpu : {"cuda", "xpu", "npu"}) EXPECT_EQ(make_accelerator(gpu)->supported_precisions(), both) << gpu;
}

TEST(BuiltinAccelerators, NpuSaysWhyItIsUnavailable) {
  auto npu = make_accelerator("npu");
  EXPECT_EQ(npu->device_type(), torch::DeviceType::PrivateUse1);
  EXPECT_EQ(npu->distributed_backend(), "hccl");
  EXPECT_FALSE(npu->is_available());
  const std::string reason = npu->availability().reason;
  if (detail::compat::kHasNamedPrivateUse1)
    EXPECT_NE(reason.find("'libtorch_npu.so' (default; set FULGOR_NPU_LIBRARY)"), std::string::npos) << reason;
  else
    EXPECT_NE(reason.find("need LibTorch 2.1 or later"), std::string::npos) << reason;
}

}  // namespace
}  // namespace fulgor
