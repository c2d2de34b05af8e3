// fulgor::Sharded outside FULL_SHARD: a stand-in that changes nothing of the
// module it wraps (its names, forward, modes and saved state), in a
// Sequential too; with checkpoint_activations, the same gradients from a
// forward that keeps no activations. Under FULL_SHARD:
// sharded_trainer_test.cpp.

#include "fulgor/distributed/sharded_unit.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fulgor/precision/precision.h"

namespace {

struct BlockImpl : torch::nn::Module {
  torch::nn::Linear linear{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::Tensor scale;
  explicit BlockImpl(int64_t n) {
    linear = register_module("linear", torch::nn::Linear(n, n));
    dropout = register_module("dropout", torch::nn::Dropout(0.5));
    scale = register_parameter("scale", torch::ones({n}));
    register_buffer("calls", torch::zeros({1}));
  }
  // Several tensors in and out, and an argument that is no tensor.
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, torch::Tensor y, double factor) {
    return {dropout(linear(x)) * scale * factor, y + 1};
  }
};
TORCH_MODULE(Block);

std::vector<std::string> names(const torch::nn::Module& module) {
  std::vector<std::string> result;
  for (const auto& item : module.named_parameters()) result.push_back(item.key());
  for (const auto& item : module.named_buffers()) result.push_back(item.key());
  return result;
}

TEST(ShardedUnit, KeepsTheNamesAndTheForwardOfTheModule) {
  torch::manual_seed(1);
  torch::nn::Sequential plain(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  torch::manual_seed(1);
  torch::nn::Sequential wrapped(fulgor::Sharded(torch::nn::Linear(3, 4)), torch::nn::ReLU(),
                                fulgor::Sharded(torch::nn::Linear(4, 2)));
  EXPECT_EQ(names(*wrapped), names(*plain));
  const torch::Tensor x = torch::randn({5, 3});
  EXPECT_TRUE(torch::equal(wrapped->forward(x), plain->forward(x)));
  std::ostringstream printed;
  printed << *wrapped;
  EXPECT_NE(printed.str().find("fulgor::Sharded(torch::nn::Linear(in_features=3, out_features=4, bias=true))"),
            std::string::npos)
      << printed.str();
  EXPECT_EQ(wrapped->ptr(0)->name(), "fulgor::Sharded<torch::nn::LinearImpl>");
}

TEST(ShardedUnit, PassesEveryArgumentAndResultAndTheMode) {
  torch::manual_seed(2);
  Block block(3);
  fulgor::Sharded<Block> unit(block);
  EXPECT_EQ(names(*unit), names(*block));
  EXPECT_FALSE(unit->sharded());
  const torch::Tensor x = torch::randn({2, 3}), y = torch::zeros({2});
  unit->eval();
  EXPECT_FALSE(block->dropout->is_training());
  auto [out, next] = unit->forward(x, y, 2.0);
  EXPECT_TRUE(torch::equal(out, block->linear(x) * 2.0));
  EXPECT_TRUE(torch::equal(next, y + 1));
  unit->train();
  EXPECT_TRUE(block->dropout->is_training());
}

// A unit's saved state is its module's: each loads the other's.
TEST(ShardedUnit, SavesWhatTheModuleSaves) {
  torch::manual_seed(3);
  fulgor::Sharded<std::shared_ptr<BlockImpl>> unit(std::make_shared<BlockImpl>(3));
  std::stringstream bytes;
  torch::save(unit, bytes);
  Block block(3);
  torch::load(block, bytes);
  for (const auto& item : unit->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), block->named_parameters()[item.key()])) << item.key();
}

fulgor::ShardedOptions checkpointed() {
  fulgor::ShardedOptions options;
  options.checkpoint_activations = true;
  return options;
}

// The gradients of every parameter of `module`, and of `x`, after a backward
// pass of `loss`; cleared for the next pass.
std::vector<torch::Tensor> gradients(const torch::Tensor& loss, torch::nn::Module& module, torch::Tensor& x) {
  loss.backward();
  std::vector<torch::Tensor> result;
  for (auto& p : module.parameters()) {
    result.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }
  if (x.requires_grad()) {
    result.push_back(x.grad().clone());
    x.mutable_grad() = torch::Tensor();
  }
  return result;
}

void expect_equal(const std::vector<torch::Tensor>& actual, const std::vector<torch::Tensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(torch::equal(actual[i], expected[i])) << "gradient " << i;
}

// The loss of Block's two results, drawing random numbers between forward
// and backward, then the next random number after backward.
std::pair<std::vector<torch::Tensor>, torch::Tensor> fit_block(fulgor::Sharded<Block>& unit, torch::Tensor x) {
  torch::manual_seed(7);
  auto [out, next] = unit->forward(x, torch::zeros({4}, torch::kFloat64), 2.0);
  const torch::Tensor weights = torch::rand(out.sizes(), torch::kFloat64);
  auto result = gradients((out * weights).sum() + next.sum(), *unit, x);
  return {result, torch::rand({3})};
}

// Dropout's mask is drawn again in backward, from the random generator as
// it was in forward: the gradients are bit for bit those without, and the
// generator is left as backward found it.
TEST(ShardedUnit, CheckpointedGradientsAreThoseWithout) {
  torch::manual_seed(4);
  Block block(6);
  block->to(torch::kFloat64);
  fulgor::Sharded<Block> plain(block);
  fulgor::Sharded<Block> unit(block, checkpointed());
  EXPECT_TRUE(unit->options().checkpoint_activations);
  const torch::Tensor x = torch::randn({4, 6}, torch::kFloat64).requires_grad_();
  const auto [expected, expected_next] = fit_block(plain, x);
  const auto [actual, actual_next] = fit_block(unit, x);
  expect_equal(actual, expected);
  EXPECT_TRUE(torch::equal(actual_next, expected_next));
  // Which matters: the mask differs from one draw to the next.
  torch::manual_seed(7);
  const torch::Tensor first = std::get<0>(unit->forward(x, torch::zeros({4}), 1.0));
  EXPECT_FALSE(torch::equal(first, std::get<0>(unit->forward(x, torch::zeros({4}), 1.0))));
}

struct DroppedImpl : torch::nn::Module {
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear linear{nullptr};
  DroppedImpl(int64_t in, int64_t out) {
    dropout = register_module("dropout", torch::nn::Dropout(0.3));
    linear = register_module("linear", torch::nn::Linear(in, out));
  }
  torch::Tensor forward(torch::Tensor x) { return linear(dropout(x)); }
};
TORCH_MODULE(Dropped);

// In a Sequential, as the first unit: its input needs no gradient, its
// parameters still get theirs.
TEST(ShardedUnit, CheckpointedUnitsInASequentialGiveTheParametersTheirGradients) {
  torch::manual_seed(5);
  torch::nn::Linear first(5, 8);
  Dropped last(8, 2);
  torch::nn::Sequential plain(first, torch::nn::Tanh(), last);
  torch::nn::Sequential wrapped(fulgor::Sharded(first, checkpointed()), torch::nn::Tanh(),
                                fulgor::Sharded(last, checkpointed()));
  plain->to(torch::kFloat64);
  torch::Tensor x = torch::randn({3, 5}, torch::kFloat64);
  torch::manual_seed(8);
  const auto expected = gradients(plain->forward(x).pow(2).sum(), *plain, x);
  torch::manual_seed(8);
  const auto actual = gradients(wrapped->forward(x).pow(2).sum(), *wrapped, x);
  ASSERT_EQ(actual.size(), 4u);
  for (const auto& g : actual) EXPECT_GT(g.abs().sum().item<double>(), 0.0);
  expect_equal(actual, expected);
}

// Counts its forward passes, and lets a test see whether its activation
// outlives them.
struct CountedImpl : torch::nn::Module {
  torch::nn::Linear linear{nullptr};
  int64_t calls = 0;
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> activation;
  CountedImpl() { linear = register_module("linear", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(const torch::Tensor& x) {
    ++calls;
    const torch::Tensor h = linear(x);
    activation.emplace(h.getIntrusivePtr());
    return h.sin();  // sin keeps its input for backward
  }
};
TORCH_MODULE(Counted);

TEST(ShardedUnit, CheckpointedUnitKeepsNoActivationAndRunsForwardAgainInBackward) {
  Counted counted;
  fulgor::Sharded<Counted> plain(counted), unit(counted, checkpointed());
  const torch::Tensor x = torch::randn({2, 4});
  torch::Tensor out = plain(x);
  EXPECT_FALSE(counted->activation->expired());  // kept by sin's backward
  out = unit(x);
  EXPECT_TRUE(counted->activation->expired());
  EXPECT_EQ(counted->calls, 2);
  out.sum().backward();
  EXPECT_EQ(counted->calls, 3);
  EXPECT_TRUE(counted->linear->weight.grad().defined());
  {
    torch::NoGradGuard no_grad;
    unit(x);
  }
  {
    c10::InferenceMode inference;
    unit(x);
  }
  EXPECT_EQ(counted->calls, 5);
}

// The gradients of a Linear's parameters after a forward under CPU autocast
// in bfloat16 (a training step's, bf16-mixed) and a backward outside it.
std::vector<torch::Tensor> autocast_gradients(fulgor::Sharded<torch::nn::Linear>& unit, torch::Tensor x) {
  const auto cpu = fulgor::make_accelerator("cpu");
  torch::Tensor out;
  {
    fulgor::AutocastScope autocast(fulgor::Precision::parse("bf16-mixed", *cpu), *cpu);
    out = unit(x);
  }
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  return gradients(out.to(torch::kFloat).pow(2).sum(), *unit, x);
}

// The forward runs again under autocast as it first ran.
TEST(ShardedUnit, CheckpointedUnitRunsAgainUnderTheAutocastOfItsForward) {
  torch::manual_seed(6);
  torch::nn::Linear linear(8, 8);
  fulgor::Sharded<torch::nn::Linear> plain(linear), unit(linear, checkpointed());
  const torch::Tensor x = torch::randn({4, 8});
  expect_equal(autocast_gradients(unit, x), autocast_gradients(plain, x));
}

// A forward that cannot run again as it first ran: a non-const reference.
struct ReportingImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x, std::vector<std::string>& report) {
    report.push_back("ran");
    return x * 2;
  }
};
TORCH_MODULE(Reporting);

TEST(ShardedUnit, CheckpointingRefusesAForwardThatCannotRunAgain) {
  fulgor::Sharded<Reporting> unit(Reporting(), checkpointed());
  std::vector<std::string> report;
  const torch::Tensor x = torch::ones({2}, torch::requires_grad());
  try {
    unit->forward(x, report);
    ADD_FAILURE() << "no ConfigError";
  } catch (const fulgor::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint_activations runs the forward again in backward, which needs "
                                         "arguments that can be copied (no non-const references)"),
              std::string::npos)
        << e.what();
  }
  torch::NoGradGuard no_grad;  // nothing to recompute
  EXPECT_TRUE(torch::equal(unit->forward(x, report), x * 2));
  EXPECT_EQ(report.size(), 1u);
}

}  // namespace
