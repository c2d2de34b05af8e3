// torch_save and save_state_dict, read back by Python's
// torch.load(weights_only=True) and load_state_dict.

#include <fulgor/core/error.h>
#include <fulgor/interop/state_dict.h>
#include <fulgor/interop/torch_load.h>
#include <fulgor/interop/torch_save.h>

#include <fmt/format.h>

#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

std::string script() { return std::string(FULGOR_INTEROP_SCRIPTS) + "/torch_files.py"; }

TEST(TorchSave, PythonReadsEveryDtypeViewAndSharedStorageWithWeightsOnly) {
  ScratchDir dir("torch_save_all");
  // What Python saved, saved again by fulgor: Python must find what it wrote.
  StateDict state = state_dict_from(torch_load(reference_dir() / "state_dict.pt"), "state_dict.pt");
  save_state_dict(state, dir.path() / "again.pt");
  std::string output;
  EXPECT_EQ(run_python(fmt::format("{} check {} {} state_dict", script(), (dir.path() / "again.pt").string(),
                                   (reference_dir() / "expected.json").string()),
                       &output),
            0)
      << output;
  // And fulgor reads its own file as it read Python's.
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& e : state_dict_from(torch_load(dir.path() / "again.pt"), "again.pt")) tensors.emplace(e.key(), e.value());
  for (auto& [name, t] : tensors) t.requires_grad_(expected()["state_dict"][name]["requires_grad"].get<bool>());
  expect_tensors(tensors, expected()["state_dict"]);
}

TEST(TorchSave, ThePythonModuleTakesTheWeightsOfTheCppModule) {
  ScratchDir dir("torch_save_network");
  torch::manual_seed(3);
  auto net = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                                   torch::nn::Linear(8, 2));
  net->train();
  net->forward(torch::randn({16, 4}));  // running statistics that are not the initial ones
  save_state_dict(*net, dir.path() / "net.pt");
  std::string output;
  ASSERT_EQ(run_python(fmt::format("{} network {} {}", script(), (dir.path() / "net.pt").string(),
                                   (dir.path() / "out.json").string()),
                       &output),
            0)
      << output;
  std::ifstream in(dir.path() / "out.json");
  auto python = nlohmann::json::parse(in);
  auto input = torch::tensor(python["input"].get<std::vector<float>>()).reshape({5, 4});
  auto want = torch::tensor(python["output"].get<std::vector<float>>()).reshape({5, 2});
  net->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(net->forward(input), want, 1e-5, 1e-6)) << net->forward(input) << want;
}

TEST(TorchSave, WritesContainersFulgorReadsBack) {
  ScratchDir dir("torch_save_values");
  auto dict = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  auto weights = torch::arange(6, torch::kFloat32).reshape({2, 3});
  dict.insert("weights", weights.t());
  dict.insert("epoch", int64_t{1} << 40);
  dict.insert("lr", 0.5);
  dict.insert("names", c10::List<std::string>({"a", "b"}));
  torch_save(dict, dir.path() / "values.pt");
  auto loaded = torch_load(dir.path() / "values.pt").toGenericDict();
  EXPECT_TRUE(torch::equal(loaded.at("weights").toTensor(), weights.t()));
  EXPECT_EQ(loaded.at("weights").toTensor().strides(), weights.t().strides());
  EXPECT_EQ(loaded.at("epoch").toInt(), int64_t{1} << 40);
  EXPECT_EQ(loaded.at("lr").toDouble(), 0.5);
  EXPECT_EQ(loaded.at("names").toList().get(1).toStringRef(), "b");
}

TEST(TorchSave, RefusesWhatPythonCannotReadAndLeavesTheOldFile) {
  ScratchDir dir("torch_save_refused");
  save_state_dict(StateDict({{"x", torch::ones(2)}}), dir.path() / "a.pt");
  auto dict = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("x", torch::zeros(2));
  dict.insert("device", c10::Device(torch::kCPU));
  EXPECT_THROW(torch_save(dict, dir.path() / "a.pt"), InteropError);
  EXPECT_TRUE(torch::equal(state_dict_from(torch_load(dir.path() / "a.pt"), "a.pt")["x"], torch::ones(2)));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace fulgor::interop_test
