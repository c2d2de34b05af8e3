#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

// A configurable accelerator for exercising the registry; its priority and
// description are what the registry ranks and lists it by.
class FakeAccelerator final : public Accelerator {
 public:
  FakeAccelerator(int priority, bool available, torch::DeviceType type)
      : priority_(priority), available_(available), type_(type) {}
  torch::DeviceType device_type() const override { return type_; }
  std::string description() const override { return "fake, priority " + std::to_string(priority_); }
  int priority() const override { return priority_; }
  Availability availability() const override {
    return available_ ? Availability{true, {}} : Availability{false, name() + " is switched off"};
  }
  int64_t device_count() const override { return available_ ? 3 : 0; }
  std::string distributed_backend() const override { return "fakeccl"; }

 private:
  int priority_;
  bool available_;
  torch::DeviceType type_;
};

AcceleratorFactory fake(int priority, bool available, torch::DeviceType type = torch::kXPU) {
  return [=] { return std::make_unique<FakeAccelerator>(priority, available, type); };
}

RegisterOptions overriding() {
  RegisterOptions options;
  options.override = true;
  return options;
}

// Registers test accelerators and removes them again, so tests stay independent.
class RegistryTest : public ::testing::Test {
 protected:
  void add(const std::string& name, AcceleratorFactory f, RegisterOptions o = {}) {
    registry().add(name, std::move(f), std::move(o));
    added_.push_back(name);
  }
  void TearDown() override {
    for (const auto& name : added_) registry().remove(name);
  }
  static AcceleratorRegistry& registry() { return AcceleratorRegistry::instance(); }
  std::vector<std::string> added_;
};

TEST_F(RegistryTest, RegistersCreatesAndRemoves) {
  add("fake_a", fake(5, true));
  EXPECT_TRUE(registry().contains("fake_a"));
  auto accelerator = registry().create("fake_a");
  EXPECT_EQ(accelerator->name(), "fake_a");
  EXPECT_EQ(accelerator->device_count(), 3);
  // Each call makes a fresh instance.
  EXPECT_NE(registry().create("fake_a").get(), accelerator.get());
  EXPECT_TRUE(registry().remove("fake_a"));
  EXPECT_FALSE(registry().contains("fake_a"));
  EXPECT_FALSE(registry().remove("fake_a"));
}

TEST_F(RegistryTest, DuplicateNamesTheEarlierRegistration) {
  RegisterOptions first;
  first.origin = "libfirst.so";
  add("fake_dup", fake(1, true), first);
  try {
    registry().add("fake_dup", fake(1, false));
    FAIL() << "a duplicate name was accepted";
  } catch (const RegistryError& e) {
    EXPECT_NE(std::string(e.what()).find("'fake_dup' is already registered (by libfirst.so)"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(registry().create("fake_dup")->is_available());
}

TEST_F(RegistryTest, OverrideReplaces) {
  add("fake_over", fake(1, true));
  registry().add("fake_over", fake(1, false), overriding());
  EXPECT_FALSE(registry().create("fake_over")->is_available());
}

TEST_F(RegistryTest, RejectsReservedAndEmptyNames) {
  EXPECT_THROW(registry().add("auto", fake(1, true)), RegistryError);
  EXPECT_THROW(registry().add("gpu", fake(1, true)), RegistryError);
  EXPECT_THROW(registry().add("", fake(1, true)), RegistryError);
  EXPECT_THROW(registry().add("fake_nofactory", nullptr), RegistryError);
}

TEST_F(RegistryTest, UnknownNameListsTheRegisteredOnes) {
  try {
    registry().create("xpuu");
    FAIL() << "an unknown name was accepted";
  } catch (const RegistryError& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown accelerator 'xpuu'; registered: cpu, cuda, npu, xpu (or \"auto\", \"gpu\")");
  }
}

// The first available accelerator in describe()'s priority order: the CPU,
// or CUDA where this machine has it.
std::string first_available() {
  for (const AcceleratorInfo& info : AcceleratorRegistry::instance().describe())
    if (info.available) return info.name;
  return "";
}

// The fakes outrank every built-in (CUDA's 400 is the highest).
TEST_F(RegistryTest, AutoPicksTheAvailableAcceleratorOfHighestPriority) {
  EXPECT_EQ(registry().resolve("auto"), first_available());
  add("fake_high_off", fake(1000, false));
  add("fake_mid", fake(700, true));
  add("fake_low", fake(600, true));
  EXPECT_EQ(registry().resolve("auto"), "fake_mid");
  EXPECT_EQ(registry().create("auto")->name(), "fake_mid");
  registry().remove("fake_mid");
  EXPECT_EQ(registry().resolve("auto"), "fake_low");
}

TEST_F(RegistryTest, GpuPicksTheFirstAvailableNonCpuAccelerator) {
  add("fake_cpu_like", fake(900, true, torch::kCPU));
  if (registry().create("cuda")->is_available()) {
    EXPECT_EQ(registry().resolve("gpu"), "cuda");
  } else {
    try {
      registry().resolve("gpu");
      FAIL() << "\"gpu\" chose an accelerator on a machine without one";
    } catch (const RegistryError& e) {
      // The message gives each candidate's reason, and names those it skipped.
      EXPECT_NE(std::string(e.what()).find("cuda: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("skipped, as their device type is the CPU: fake_cpu_like, cpu"),
                std::string::npos)
          << e.what();
    }
  }
  add("fake_gpu_low", fake(600, true));
  add("fake_gpu_high", fake(700, true));
  EXPECT_EQ(registry().resolve("gpu"), "fake_gpu_high");
  EXPECT_EQ(registry().resolve("auto"), "fake_cpu_like");
}

TEST_F(RegistryTest, DescribeReportsAvailabilityInPriorityOrder) {
  add("fake_desc", fake(250, false));
  auto infos = registry().describe();
  std::vector<std::string> order;
  for (const auto& info : infos) order.push_back(info.name);
  EXPECT_EQ(order, (std::vector<std::string>{"cuda", "xpu", "fake_desc", "npu", "cpu"}));
  AcceleratorInfo info = registry().describe("fake_desc");
  EXPECT_FALSE(info.available);
  EXPECT_EQ(info.reason, "fake_desc is switched off");
  EXPECT_EQ(info.distributed_backend, "fakeccl");
  EXPECT_EQ(info.priority, 250);
  EXPECT_EQ(info.description, "fake, priority 250");
  EXPECT_EQ(info.device_count, 0);
}

// The name is the registration's: one class registered twice answers to each
// name, and its availability reason (which uses name()) is given under it.
TEST_F(RegistryTest, InstancesCarryTheNameTheyWereRegisteredUnder) {
  add("fake_one", fake(1, false));
  add("fake_two", fake(1, false));
  EXPECT_EQ(registry().create("fake_one")->name(), "fake_one");
  EXPECT_EQ(registry().create("fake_two")->name(), "fake_two");
  EXPECT_EQ(registry().describe("fake_two").reason, "fake_two is switched off");
  EXPECT_EQ(FakeAccelerator(1, true, torch::kXPU).name(), "");
}

TEST_F(RegistryTest, RefusesAFactoryThatMakesNoAccelerator) {
  try {
    registry().add("fake_null", [] { return std::unique_ptr<Accelerator>(); });
    FAIL() << "a factory making no accelerator was accepted";
  } catch (const RegistryError& e) {
    EXPECT_EQ(std::string(e.what()), "the factory of accelerator 'fake_null' made no accelerator");
  }
  EXPECT_FALSE(registry().contains("fake_null"));
}

TEST_F(RegistryTest, ThreadSafeRegistrationAndLookup) {
  constexpr int kThreads = 8, kPerThread = 25;
  const std::string chosen = registry().resolve("auto");
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string name = "fake_t" + std::to_string(t) + "_" + std::to_string(i);
        try {
          registry().add(name, fake(-100, true));
          if (registry().create(name)->name() != name) ++failures;
          if (registry().resolve("auto") != chosen) ++failures;
          registry().names();
        } catch (const std::exception&) {
          ++failures;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kPerThread; ++i) {
      std::string name = "fake_t" + std::to_string(t) + "_" + std::to_string(i);
      EXPECT_TRUE(registry().remove(name)) << name;
    }
}

}  // namespace
}  // namespace fulgor
