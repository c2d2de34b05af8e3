// Models defined in Python (torch.jit.script and torch.jit.trace, saved by
// python3-torch here) trained from C++ by the Trainer and by Fabric, kept in
// fulgor's checkpoints and exported back to Python as a state dict.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "../distributed/support/spawn.h"
#include "../support/python_reference.h"
#include "fulgor/fulgor.h"
#include "fulgor/jit/torchscript_module.h"
#include "torchscript.h"  // docs/ways_in.md's train_script

namespace {

using fulgor::test::TempDir;

const std::string kScript = FULGOR_TORCHSCRIPT_MODEL;

nlohmann::json run_python(const std::string& mode, const TempDir& dir) {
  // python_reference appends the output path as the last argument.
  return fulgor::test::python_reference("/usr/bin/python3", kScript + " " + mode + " " + dir.str(), "jit_" + mode);
}

std::pair<torch::Tensor, torch::Tensor> make_data() {
  torch::Generator generator = at::detail::createCPUGenerator(9);
  return {torch::randn({64, 4}, generator), torch::randn({64, 1}, generator)};
}

fulgor::TorchScriptOptions sgd_options() {
  fulgor::TorchScriptOptions options;
  options.loss = "mse";
  options.optimizer = [](std::vector<torch::Tensor> parameters) -> fulgor::OptimizerConfig {
    return std::make_shared<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.1));
  };
  return options;
}

fulgor::TensorLoaderOptions batches_of_16() {
  fulgor::TensorLoaderOptions options;
  options.batch_size = 16;
  return options;
}

// The same training written by hand: forward, MSE, SGD.
std::vector<torch::Tensor> train_by_hand(const std::string& path, int64_t epochs) {
  fulgor::TorchScriptModule model(path, sgd_options());
  model.train();
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  auto [x, y] = make_data();
  fulgor::TensorLoader loader(x, y, batches_of_16());
  for (int64_t epoch = 0; epoch < epochs; ++epoch)
    for (auto& batch : loader) {
      sgd.zero_grad();
      model.loss(model.forward(batch.data), batch.target).backward();
      sgd.step();
    }
  return model.parameters();
}

void expect_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

fulgor::TrainerOptions quiet(const std::string& root, int64_t epochs) {
  fulgor::TrainerOptions options;
  options.accelerator = "cpu";
  options.max_epochs = epochs;
  options.default_root_dir = root;
  options.logger = false;
  options.enable_checkpointing = false;
  options.enable_progress_bar = false;
  options.enable_model_summary = false;
  options.num_sanity_val_steps = 0;
  return options;
}

TEST(TorchScript, ParametersAndBuffersKeepPythonsNames) {
  TempDir dir;
  const nlohmann::json made = run_python("make", dir);
  for (const char* file : {"scripted.pt", "traced.pt"}) {
    fulgor::TorchScriptModule model(dir / file, sgd_options());
    // The same names; the order differs (parameters first, then buffers),
    // which load_state_dict does not mind.
    std::vector<std::string> keys;
    for (const auto& item : fulgor::state_dict_of(model)) keys.push_back(item.key());
    auto python = made.at("keys").get<std::vector<std::string>>();
    std::sort(keys.begin(), keys.end());
    std::sort(python.begin(), python.end());
    EXPECT_EQ(keys, python) << file;
  }
}

TEST(TorchScript, TrainerTrainsAScriptedModuleAndPythonLoadsItBack) {
  TempDir dir;
  run_python("make", dir);
  const std::string path = dir / "scripted.pt";
  fulgor::TorchScriptModule model(path, sgd_options());
  auto [x, y] = make_data();
  fulgor::Trainer trainer(quiet(dir.str(), 2));
  fulgor::TensorLoader loader(x, y, batches_of_16());
  trainer.fit(model, loader);
  expect_equal(model.parameters(), train_by_hand(path, 2));
  EXPECT_FALSE(torch::equal(model.parameters()[0], fulgor::TorchScriptModule(path, sgd_options()).parameters()[0]))
      << "training changed nothing";

  // The checkpoint's model is the parameters and buffers, as any module's.
  const std::string ckpt = dir / "trained.ckpt";
  trainer.save_checkpoint(ckpt);
  std::vector<std::string> saved, own;
  for (const auto& item : fulgor::read_weights(ckpt)) saved.push_back(item.key());
  for (const auto& item : fulgor::state_dict_of(model)) own.push_back(item.key());
  std::sort(saved.begin(), saved.end());
  std::sort(own.begin(), own.end());
  EXPECT_EQ(saved, own);
  fulgor::TorchScriptModule restored(path, sgd_options());
  fulgor::load_module_weights(restored, ckpt);
  const auto trained = fulgor::state_dict_of(model), loaded = fulgor::state_dict_of(restored);
  for (const auto& item : trained) EXPECT_TRUE(torch::equal(item.value(), loaded[item.key()])) << item.key();

  // Back to Python: a state dict its module loads strictly, computing what C++ computes.
  fulgor::save_state_dict(model, dir / "exported.pt");
  const torch::Tensor input = torch::randn({6, 4});
  fulgor::torch_save(input, dir / "input.pt");
  const nlohmann::json checked = run_python("check", dir);
  model.eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor expected = model.forward(input).reshape({-1});
  EXPECT_TRUE(torch::allclose(torch::tensor(checked.at("output").get<std::vector<float>>()), expected, 1e-5, 1e-6))
      << expected;
}

TEST(TorchScript, FabricTrainsATracedModule) {
  TempDir dir;
  run_python("make", dir);
  const std::string path = dir / "traced.pt";
  fulgor::Fabric fabric({.accelerator = "cpu"});
  fulgor::TorchScriptModule model(path, sgd_options());
  model.train();
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  auto optimizer = fabric.setup(model, sgd);
  auto [x, y] = make_data();
  auto loader = fabric.setup_dataloaders(fulgor::TensorLoader(x, y, batches_of_16()));
  for (int64_t epoch = 0; epoch < 2; ++epoch)
    for (auto& batch : loader) {
      optimizer.zero_grad();
      fabric.backward(model.loss(model.forward(batch.data), batch.target));
      optimizer.step();
    }
  expect_equal(model.parameters(), train_by_hand(path, 2));
  int64_t epoch = 2;
  fabric.save(dir / "fabric.ckpt", {{"model", model}, {"optimizer", sgd}, {"epoch", epoch}});
  fulgor::TorchScriptModule restored(path, sgd_options());
  fabric.load(dir / "fabric.ckpt", {{"model", restored}});
  expect_equal(restored.parameters(), model.parameters());
}

TEST(TorchScript, TheDocsFunctionTrainsAndExports) {
  TempDir dir;
  run_python("make", dir);
  auto [x, y] = make_data();
  const std::string exported = dir / "exported.pt";
  const auto before = fulgor::state_dict_of(fulgor::TorchScriptModule(dir / "scripted.pt"));
  // The Trainer writes its logs and checkpoints under the working folder.
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.str());
  train_script(dir / "scripted.pt", x, y, exported);
  std::filesystem::current_path(cwd);
  const fulgor::StateDict after = fulgor::read_weights(exported);
  ASSERT_EQ(after.size(), before.size());
  EXPECT_FALSE(torch::equal(after["head.weight"], before["head.weight"])) << "training changed nothing";
}

TEST(TorchScript, BadInputIsNamed) {
  TempDir dir;
  run_python("make", dir);
  std::ofstream(dir / "not_a_script.pt") << "plain text";
  try {
    fulgor::TorchScriptModule model(dir / "not_a_script.pt", sgd_options());
    FAIL() << "loaded a file that is not TorchScript";
  } catch (const fulgor::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a TorchScript file"), std::string::npos) << e.what();
  }
  fulgor::TorchScriptModule model(dir / "scripted.pt", sgd_options());
  try {
    model.forward(torch::randn({3, 7}));
    FAIL() << "forward took 7 features where the network takes 4";
  } catch (const fulgor::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("forward failed on the given inputs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.forward(std::vector<torch::jit::IValue>{}), fulgor::ConfigError);
  fulgor::TorchScriptOptions unknown_loss;
  unknown_loss.loss = "hinge";
  EXPECT_THROW(fulgor::TorchScriptModule(dir / "scripted.pt", unknown_loss), fulgor::ConfigError);
  fulgor::TorchScriptModule no_optimizer(dir / "scripted.pt");
  EXPECT_THROW(no_optimizer.configure_optimizers(), fulgor::ConfigError);
}

}  // namespace
