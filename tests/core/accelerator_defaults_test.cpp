// What Accelerator's defaults do for a subclass that overrides only what it
// must: "auto" devices, CPU-backed devices, precisions, and seeding, alone and
// through seed_everything.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/precision/precision.h"
#include "fulgor/core/registry.h"
#include "fulgor/config/seed.h"

namespace fulgor {
namespace {

// An accelerator of `count` devices of `type`, of which "auto" uses
// `auto_count`; it records the seeds manual_seed is given, by registered name.
class MinimalAccelerator final : public Accelerator {
 public:
  MinimalAccelerator(torch::DeviceType type, int64_t count, int64_t auto_count, bool available = true)
      : type_(type), count_(count), auto_count_(auto_count), available_(available) {}
  torch::DeviceType device_type() const override { return type_; }
  std::string description() const override { return "overrides only what it must"; }
  int priority() const override { return -100; }
  Availability availability() const override {
    return available_ ? Availability{true, {}} : Availability{false, "switched off"};
  }
  int64_t device_count() const override { return available_ ? count_ : 0; }
  int64_t auto_device_count() const override { return auto_count_; }
  std::string distributed_backend() const override { return "gloo"; }
  void manual_seed(uint64_t seed) const override {
    seeds()[name()].push_back(seed);
    Accelerator::manual_seed(seed);
  }

  static std::map<std::string, std::vector<uint64_t>>& seeds() {
    static std::map<std::string, std::vector<uint64_t>> by_name;
    return by_name;
  }

 private:
  torch::DeviceType type_;
  int64_t count_, auto_count_;
  bool available_;
};

TEST(AcceleratorDefaults, AutoSelectsTheAutoDeviceCount) {
  const MinimalAccelerator xpu(torch::kXPU, 4, 2);
  const std::vector<torch::Device> first_two = {torch::Device(torch::kXPU, 0), torch::Device(torch::kXPU, 1)};
  EXPECT_EQ(xpu.parse_devices("auto"), first_two);
  EXPECT_EQ(xpu.parse_devices(" auto "), first_two);
  EXPECT_EQ(xpu.parse_devices(-1).size(), 4u);
  EXPECT_EQ(xpu.parse_devices(3).size(), 3u);
}

// LibTorch's CPU tensors are on `cpu`: every device of a CPU-backed
// accelerator must be that, or moved tensors would not be where it says.
TEST(AcceleratorDefaults, CpuBackedDevicesAreTheCpuDevice) {
  const MinimalAccelerator host(torch::kCPU, 3, 3);
  const torch::Device cpu(torch::kCPU);
  EXPECT_EQ(host.device(2), cpu);
  EXPECT_EQ(host.parse_devices("auto"), std::vector<torch::Device>(3, cpu));
  EXPECT_EQ(host.parse_devices("1,"), std::vector<torch::Device>{cpu});
  EXPECT_THROW(host.parse_devices(4), ConfigError);
  // Where a tensor moved to it is.
  EXPECT_EQ(host.move_tensor(torch::ones({2}), host.device(1), false).device(), host.device(1));
}

// Makes the helper that backends build supported_precisions() from callable here.
struct PrecisionsOfABackend : Accelerator {
  using Accelerator::precisions_with;
};

TEST(AcceleratorDefaults, PrecisionsAreFullOnesUnlessTheBackendNamesReducedTypes) {
  const MinimalAccelerator plain(torch::kCPU, 1, 1);
  EXPECT_EQ(plain.supported_precisions(), (std::vector<std::string>{"32-true", "64-true"}));
  EXPECT_EQ(PrecisionsOfABackend::precisions_with({}), plain.supported_precisions());
  EXPECT_EQ(PrecisionsOfABackend::precisions_with({torch::kBFloat16}),
            (std::vector<std::string>{"32-true", "64-true", "bf16-mixed", "bf16-true"}));
  const auto all = PrecisionsOfABackend::precisions_with({torch::kHalf, torch::kBFloat16});
  EXPECT_EQ(all, (std::vector<std::string>{"32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"}));
  // Every precision Precision knows, and no other: the two name them alike.
  const auto known = Precision::known();
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()), std::set<std::string>(known.begin(), known.end()));
  try {
    PrecisionsOfABackend::precisions_with({torch::kFloat});
    ADD_FAILURE() << "float32 was taken for a reduced type";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("Float is not a reduced floating-point type; accepted: Half, BFloat16"),
              std::string::npos)
        << e.what();
  }
}

// Seeding a CPU-backed accelerator seeds the CPU's generator.
TEST(AcceleratorDefaults, CpuBackedManualSeedSeedsTheCpu) {
  const MinimalAccelerator host(torch::kCPU, 2, 2);
  host.manual_seed(3);
  const torch::Tensor first = torch::rand({8});
  host.manual_seed(3);
  EXPECT_TRUE(torch::equal(torch::rand({8}), first));
  host.manual_seed(4);
  EXPECT_FALSE(torch::equal(torch::rand({8}), first));
}

// A device LibTorch has no generator for is left alone.
TEST(AcceleratorDefaults, ManualSeedSkipsDevicesWithoutAGenerator) {
  const MinimalAccelerator xpu(torch::kXPU, 2, 2);
  EXPECT_FALSE(xpu.get_rng_state(torch::Device(torch::kXPU, 0)).defined());
  EXPECT_NO_THROW(xpu.manual_seed(3));
}

TEST(SeedEverything, SeedsTheCpuAndEveryAvailableAccelerator) {
  auto& registry = AcceleratorRegistry::instance();
  registry.add("seed_on", [] { return std::make_unique<MinimalAccelerator>(torch::kCPU, 1, 1); });
  registry.add("seed_off", [] { return std::make_unique<MinimalAccelerator>(torch::kCPU, 1, 1, false); });
  MinimalAccelerator::seeds().clear();
  EXPECT_EQ(seed_everything(17), 17u);
  const torch::Tensor first = torch::rand({8});
  seed_everything(17);
  const torch::Tensor again = torch::rand({8});
  seed_everything(18);
  const torch::Tensor other = torch::rand({8});
  registry.remove("seed_on");
  registry.remove("seed_off");
  EXPECT_TRUE(torch::equal(again, first));
  EXPECT_FALSE(torch::equal(other, first));
  EXPECT_EQ(MinimalAccelerator::seeds()["seed_on"], (std::vector<uint64_t>{17, 17, 18}));
  EXPECT_EQ(MinimalAccelerator::seeds().count("seed_off"), 0u);
}

// What the Trainer's seed option does: the CPU's generator, which a device
// without a generator of its own draws from, and the accelerator's devices.
TEST(SeedEverything, SeedAcceleratorSeedsTheCpuAndTheAccelerator) {
  auto& registry = AcceleratorRegistry::instance();
  registry.add("seed_xpu", [] { return std::make_unique<MinimalAccelerator>(torch::kXPU, 1, 1); });
  const std::unique_ptr<Accelerator> xpu = registry.create("seed_xpu");
  registry.remove("seed_xpu");
  MinimalAccelerator::seeds().clear();
  seed_accelerator(*xpu, 5);
  const torch::Tensor first = torch::rand({8});
  seed_accelerator(*xpu, 5);
  EXPECT_TRUE(torch::equal(torch::rand({8}), first));
  EXPECT_EQ(MinimalAccelerator::seeds()["seed_xpu"], (std::vector<uint64_t>{5, 5}));
}

}  // namespace
}  // namespace fulgor
