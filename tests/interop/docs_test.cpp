// The journeys of docs/interop.md, compiled as written and run on the files
// Python wrote.

#include <fmt/format.h>

#include "docs/interop_journeys.h"
#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

TEST(InteropDocs, FineTuneInCppFromPythonWeightsAndHandThemBack) {
  ScratchDir dir("interop_docs");
  Regressor model;
  finetune_from_python(model, (reference_dir() / "net.ckpt").string(), dir.path().string());
  // Trained from Python's weights: they moved, from where Python left them.
  auto first = model.net[0]->as<torch::nn::Linear>()->weight;
  EXPECT_NE(hex_of(first), expected()["network"]["state_dict"]["0.weight"]["hex"].get<std::string>());
  hand_back_to_python(model, (dir.path() / "net.pt").string());
  std::string output;
  ASSERT_EQ(run_python(fmt::format("{}/torch_files.py network {} {}", FULGOR_INTEROP_SCRIPTS,
                                   (dir.path() / "net.pt").string(), (dir.path() / "out.json").string()),
                       &output),
            0)
      << output;
  std::ifstream in(dir.path() / "out.json");
  auto python = nlohmann::json::parse(in);
  auto input = torch::tensor(python["input"].get<std::vector<float>>()).reshape({5, 4});
  model.net->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(model.net->forward(input),
                              torch::tensor(python["output"].get<std::vector<float>>()).reshape({5, 2}), 1e-5, 1e-6));
}

TEST(InteropDocs, ContinueALightningRun) {
  ScratchDir dir("interop_docs_resume");
  Regressor model;
  // Two epochs of four batches were done in Python; one more epoch here.
  fulgor::FitResult result =
      continue_lightning_run(model, (reference_dir() / "net_resume.ckpt").string(), dir.path().string(), 12);
  EXPECT_EQ(result.reason, StopReason::max_steps) << result.message;
  EXPECT_EQ(result.global_step, 12);
  EXPECT_EQ(result.epochs_completed, 3);
  EXPECT_NE(hex_of(model.net[3]->as<torch::nn::Linear>()->bias),
            expected()["network"]["resume_state_dict"]["net.3.bias"]["hex"].get<std::string>());

  // The run's last checkpoint (the default ModelCheckpoint's), for Lightning.
  std::string saved;
  for (const auto& entry : fs::recursive_directory_iterator(dir.path()))
    if (entry.path().extension() == ".ckpt") saved = entry.path().string();
  ASSERT_FALSE(saved.empty());
  EXPECT_TRUE(hand_run_to_lightning(saved, (dir.path() / "lightning.ckpt").string()).left_out.empty());
  auto lightning = torch_load(dir.path() / "lightning.ckpt").toGenericDict();
  EXPECT_EQ(lightning.at("global_step").toInt(), 12);
  EXPECT_EQ(hex_of(lightning.at("state_dict").toGenericDict().at("net.3.bias").toTensor()),
            hex_of(model.net[3]->as<torch::nn::Linear>()->bias));
  auto states = lightning.at("optimizer_states").toListRef()[0].toGenericDict().at("state").toGenericDict();
  EXPECT_EQ(states.size(), model.parameters().size());  // SGD's momentum buffers, Python's carried on

  Regressor by_hand;
  continue_by_hand(by_hand, (reference_dir() / "net_resume.ckpt").string());
  EXPECT_EQ(hex_of(by_hand.net[3]->as<torch::nn::Linear>()->bias),
            expected()["network"]["resume_state_dict"]["net.3.bias"]["hex"].get<std::string>());
}

}  // namespace
}  // namespace fulgor::interop_test
