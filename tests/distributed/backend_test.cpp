#include "fulgor/distributed/backend.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "fulgor/distributed/process_group.h"
#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "support/spawn.h"

namespace {

// A backend a plugin would declare; it delegates to gloo so it can really run.
REGISTER_DISTRIBUTED_BACKEND("test-gloo-alias", [](const fulgor::DistributedBackendContext& context) {
  return fulgor::make_distributed_backend("gloo", context);
});

fulgor::DistributedEnvironment one_process() {
  fulgor::DistributedEnvironment env;
  env.master_port = fulgor::test::free_port();
  return env;
}

TEST(DistributedBackends, GlooIsBuiltInAndPluginsAreListed) {
  const std::vector<std::string> names = fulgor::distributed_backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "gloo"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "test-gloo-alias"), names.end());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

TEST(DistributedBackends, UnknownNameListsTheKnownOnes) {
  auto cpu = fulgor::make_accelerator("cpu");
  try {
    fulgor::ProcessGroup(one_process(), *cpu, torch::Device(torch::kCPU), {"no-such-backend"});
    FAIL() << "expected ConfigError";
  } catch (const fulgor::ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'no-such-backend'"), std::string::npos) << message;
    EXPECT_NE(message.find("gloo"), std::string::npos) << message;
  }
}

TEST(DistributedBackends, FactoryFailureBecomesDistributedError) {
  fulgor::register_distributed_backend(
      "test-broken",
      [](const fulgor::DistributedBackendContext&) -> c10::intrusive_ptr<fulgor::detail::compat::CollectiveBackend> {
        throw std::runtime_error("no device here");
      });
  auto cpu = fulgor::make_accelerator("cpu");
  try {
    fulgor::ProcessGroup(one_process(), *cpu, torch::Device(torch::kCPU), {"test-broken"});
    FAIL() << "expected DistributedError";
  } catch (const fulgor::DistributedError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("test-broken"), std::string::npos) << message;
    EXPECT_NE(message.find("no device here"), std::string::npos) << message;
  }
}

TEST(ProcessGroup, AcceleratorNamesTheBackend) {
  auto cpu = fulgor::make_accelerator("cpu");
  fulgor::ProcessGroup group(one_process(), *cpu, torch::Device(torch::kCPU), {"", std::chrono::seconds(30)});
  EXPECT_EQ(group.backend(), cpu->distributed_backend());
  EXPECT_EQ(group.size(), 1);
  EXPECT_EQ(group.rank(), 0);
  torch::Tensor t = torch::tensor({1.5, -2.0});
  group.all_reduce(t, fulgor::ReduceOp::mean);
  EXPECT_TRUE(t.equal(torch::tensor({1.5, -2.0})));
  EXPECT_DOUBLE_EQ(group.all_reduce(4.25, fulgor::ReduceOp::sum), 4.25);
  group.barrier();
}

TEST(ProcessGroup, PluginBackendRuns) {
  auto cpu = fulgor::make_accelerator("cpu");
  fulgor::ProcessGroup group(one_process(), *cpu, torch::Device(torch::kCPU), {"test-gloo-alias"});
  EXPECT_EQ(group.backend(), "test-gloo-alias");
  torch::Tensor t = torch::tensor({3.0f});
  group.all_reduce(t, fulgor::ReduceOp::max);
  EXPECT_FLOAT_EQ(t.item<float>(), 3.0f);
}

TEST(ProcessGroup, RejectsMeanOfIntegersAndBadRoots) {
  auto cpu = fulgor::make_accelerator("cpu");
  fulgor::ProcessGroup group(one_process(), *cpu, torch::Device(torch::kCPU));
  torch::Tensor integers = torch::tensor({1, 2});
  EXPECT_THROW(group.all_reduce(integers, fulgor::ReduceOp::mean), fulgor::ConfigError);
  torch::Tensor t = torch::zeros({2});
  EXPECT_THROW(group.broadcast(t, 1), fulgor::ConfigError);
}

TEST(ProcessGroup, RejectsNonPositiveTimeout) {
  auto cpu = fulgor::make_accelerator("cpu");
  EXPECT_THROW(
      fulgor::ProcessGroup(one_process(), *cpu, torch::Device(torch::kCPU), {"", std::chrono::milliseconds(0)}),
      fulgor::ConfigError);
}

}  // namespace
