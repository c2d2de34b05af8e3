// fulgor::Sharded outside FULL_SHARD: a stand-in that changes nothing of the
// module it wraps (its names, forward, modes and saved state), in a
// Sequential too. Under FULL_SHARD: sharded_trainer_test.cpp.

#include "fulgor/distributed/sharded_unit.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <tuple>

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

}  // namespace
