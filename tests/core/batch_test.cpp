// Moving modules and batches, onto LibTorch's meta device: a real device type
// other than the CPU that every LibTorch has.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fulgor/core/batch.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

const torch::Device kMeta(torch::kMeta);

struct Net : torch::nn::Module {
  Net() {
    fc = register_module("fc", torch::nn::Linear(3, 2));
    bn = register_module("bn", torch::nn::BatchNorm1d(2));
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

TEST(MoveModule, MovesEveryParameterAndBufferInPlace) {
  auto cpu = make_accelerator("cpu");
  Net net;
  std::vector<const c10::TensorImpl*> before;
  for (const auto& p : net.parameters()) before.push_back(p.unsafeGetTensorImpl());
  torch::optim::SGD optimizer(net.parameters(), 0.1);
  cpu->move_module(net, kMeta);
  size_t i = 0;
  for (const auto& p : net.parameters()) {
    EXPECT_EQ(p.device(), kMeta);
    EXPECT_TRUE(p.requires_grad());
    EXPECT_EQ(p.unsafeGetTensorImpl(), before[i++]) << "a parameter was replaced, not moved";
  }
  for (const auto& b : net.buffers()) EXPECT_EQ(b.device(), kMeta);
  // The optimizer holds the same tensors, so it sees the moved ones.
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) EXPECT_EQ(p.device(), kMeta);
}

TEST(MoveBatch, MovesNestedTensorsAndLeavesValues) {
  auto cpu = make_accelerator("cpu");
  using Example = torch::data::Example<>;
  auto example = move_batch(Example(torch::ones({2}), torch::zeros({2})), *cpu, kMeta);
  EXPECT_EQ(example.data.device(), kMeta);
  EXPECT_EQ(example.target.device(), kMeta);

  auto tuple = move_batch(std::make_tuple(torch::ones({1}), 5, std::string("id")), *cpu, kMeta);
  EXPECT_EQ(std::get<0>(tuple).device(), kMeta);
  EXPECT_EQ(std::get<1>(tuple), 5);
  EXPECT_EQ(std::get<2>(tuple), "id");

  std::vector<Example> examples{Example(torch::ones({1}), torch::ones({1}))};
  EXPECT_EQ(move_batch(examples, *cpu, kMeta)[0].target.device(), kMeta);

  std::map<std::string, torch::Tensor> named{{"x", torch::ones({1})}, {"y", torch::ones({1})}};
  for (const auto& [name, tensor] : move_batch(named, *cpu, kMeta)) EXPECT_EQ(tensor.device(), kMeta) << name;

  std::unordered_map<int, std::pair<torch::Tensor, double>> nested{{1, {torch::ones({1}), 0.5}}};
  auto moved = move_batch(nested, *cpu, kMeta);
  EXPECT_EQ(moved.at(1).first.device(), kMeta);
  EXPECT_EQ(moved.at(1).second, 0.5);

  auto unsupervised =
      move_batch(torch::data::Example<torch::Tensor, torch::data::example::NoTarget>(torch::ones({1})), *cpu, kMeta);
  EXPECT_EQ(unsupervised.data.device(), kMeta);
}

// A user batch type, moved through its own BatchTransfer specialisation.
struct Pair {
  torch::Tensor image;
  int64_t label;
};

}  // namespace

template <>
struct BatchTransfer<Pair> {
  static Pair move(Pair p, const Accelerator& a, torch::Device d, bool non_blocking) {
    p.image = move_batch(std::move(p.image), a, d, non_blocking);
    return p;
  }
};

namespace {

TEST(MoveBatch, UserTypesPlugIn) {
  auto cpu = make_accelerator("cpu");
  Pair moved = move_batch(Pair{torch::ones({1}), 3}, *cpu, kMeta);
  EXPECT_EQ(moved.image.device(), kMeta);
  EXPECT_EQ(moved.label, 3);
}

}  // namespace
}  // namespace fulgor
