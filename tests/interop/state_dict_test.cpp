// load_state_dict: Python's weights into the equivalent LibTorch network, by
// name, from bare state dicts, containers and Lightning checkpoints.

#include <fulgor/core/error.h>
#include <fulgor/interop/state_dict.h>

#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

// torch_files.py's network(), built as a C++ user would.
torch::nn::Sequential python_network() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                               torch::nn::Linear(8, 2));
}

// Loaded: the network gives Python's outputs for Python's inputs.
void expect_python_outputs(torch::nn::Sequential& net) {
  const auto& want = expected()["network"];
  auto input = torch::tensor(want["input"].get<std::vector<float>>()).reshape({5, 4});
  auto output = torch::tensor(want["output"].get<std::vector<float>>()).reshape({5, 2});
  net->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(net->forward(input), output, 1e-5, 1e-6)) << net->forward(input) << output;
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& entry : state_dict_of(*net)) tensors.emplace(entry.key(), entry.value());
  for (const auto& [name, w] : want["state_dict"].items()) EXPECT_EQ(hex_of(tensors.at(name)), w["hex"]) << name;
}

TEST(LoadStateDict, LoadsABareStateDictByName) {
  auto net = python_network();
  auto result = load_state_dict(*net, reference_dir() / "net.pt");
  EXPECT_TRUE(result.all_matched()) << result.describe();
  expect_python_outputs(net);
}

TEST(LoadStateDict, LoadsTheModelOfAModelAndOptimizerContainer) {
  auto net = python_network();
  load_state_dict(*net, reference_dir() / "net_model.pt");
  expect_python_outputs(net);
}

TEST(LoadStateDict, LoadsALightningCheckpointStrippingTheAttributePrefix) {
  auto net = python_network();
  try {
    load_state_dict(*net, reference_dir() / "net.ckpt");
    ADD_FAILURE() << "strict loading of prefixed keys succeeded";
  } catch (const InteropError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("missing keys: 0.weight, 0.bias"), std::string::npos) << what;
    EXPECT_NE(what.find("unexpected keys: model.0.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("net.ckpt"), std::string::npos) << what;
  }
  LoadStateDictOptions options;
  options.strip_prefix = "model.";
  EXPECT_TRUE(load_state_dict(*net, reference_dir() / "net.ckpt", options).all_matched());
  expect_python_outputs(net);
}

TEST(LoadStateDict, AddsPrefixesAndRenamesKeys) {
  struct Wrapped : torch::nn::Module {
    Wrapped() { backbone = register_module("backbone", python_network()); }
    torch::nn::Sequential backbone{nullptr};
  } wrapped;
  LoadStateDictOptions options;
  options.add_prefix = "backbone.";
  EXPECT_TRUE(load_state_dict(wrapped, reference_dir() / "net.pt", options).all_matched());
  expect_python_outputs(wrapped.backbone);

  auto net = python_network();
  options = {};
  options.strip_prefix = "model.";
  options.rename = [](const std::string& key) { return key.rfind("1.", 0) == 0 ? std::string() : key; };
  options.strict = false;
  auto result = load_state_dict(*net, reference_dir() / "net.ckpt", options);
  EXPECT_EQ(result.missing_keys, (std::vector<std::string>{"1.weight", "1.bias", "1.running_mean", "1.running_var",
                                                            "1.num_batches_tracked"}));
  EXPECT_TRUE(result.unexpected_keys.empty());
}

TEST(LoadStateDict, ReportsEveryMismatchAndLoadsNothingWhenStrict) {
  auto net = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                                   torch::nn::Linear(8, 3));  // 3 outputs, not 2
  auto& first = net[0]->as<torch::nn::Linear>()->weight;
  first.set_data(first.to(torch::kFloat64));
  auto before = first.clone();
  try {
    load_state_dict(*net, reference_dir() / "net.pt");
    ADD_FAILURE();
  } catch (const InteropError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("3.weight: the file has Float [2, 8], the module Float [3, 8]"), std::string::npos) << what;
    EXPECT_NE(what.find("3.bias: the file has Float [2], the module Float [3]"), std::string::npos) << what;
    EXPECT_NE(what.find("0.weight: the file has Float [8, 4], the module Double [8, 4]"), std::string::npos) << what;
  }
  EXPECT_TRUE(torch::equal(before, first));
  EXPECT_EQ(net[1]->as<torch::nn::BatchNorm1d>()->num_batches_tracked.item<int64_t>(), 0);

  LoadStateDictOptions lenient;
  lenient.strict = false;
  auto result = load_state_dict(*net, reference_dir() / "net.pt", lenient);
  ASSERT_EQ(result.mismatched_keys.size(), 3u);
  EXPECT_EQ(result.mismatched_keys[0].key, "0.weight");
  EXPECT_EQ(result.mismatched_keys[0].file_dtype, torch::kFloat32);
  EXPECT_EQ(result.mismatched_keys[0].module_dtype, torch::kFloat64);
  EXPECT_TRUE(torch::equal(before, first));
  EXPECT_TRUE(result.missing_keys.empty());
  EXPECT_TRUE(result.unexpected_keys.empty());
  EXPECT_EQ(hex_of(net[1]->as<torch::nn::BatchNorm1d>()->num_batches_tracked),
            expected()["network"]["state_dict"]["1.num_batches_tracked"]["hex"].get<std::string>());
}

}  // namespace
}  // namespace fulgor::interop_test
