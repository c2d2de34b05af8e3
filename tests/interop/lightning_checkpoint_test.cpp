// fulgor's runs as Lightning .ckpt files: what Lightning 2.6 reads of them,
// and torch.optim's next step from their optimizer states is fulgor's
// (tests/interop/lightning_export.py).

#include <fmt/format.h>
#include <fulgor/fulgor.h>
#include <fulgor/interop/lightning_checkpoint.h>

#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

// One epoch of optim_resume.py's four batches: fulgor's resume and Python's
// next step (lightning_export.py's, from global_step) both take batch 0.
constexpr int64_t kStepsBeforeExport = 4;

// optim_resume.py's Net and cases, trained by fulgor; lightning_export.py's
// LitNet holds it as `self.model` and takes its hyper-parameters.
struct ExportNet : Module {
  torch::nn::Sequential net{torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2)};
  std::string optimizer;
  explicit ExportNet(std::string kind) : optimizer(std::move(kind)) {
    register_module("net", net);
    save_hyperparameters({{"hidden", 8}, {"label", "fulgor"}});
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::mse_loss(net->forward(batch.data), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    if (optimizer == "sgd") {
      auto sgd = std::make_shared<torch::optim::SGD>(
          parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(0.01));
      return OptimizerConfig(sgd, SchedulerConfig{std::make_shared<StepLR>(*sgd, 4, 0.5), Interval::step});
    }
    if (optimizer == "adam")
      return OptimizerConfig(std::make_shared<torch::optim::Adam>(
          parameters(), torch::optim::AdamOptions(0.01).betas({0.8, 0.99}).weight_decay(0.01).amsgrad(true)));
    return OptimizerConfig(
        std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(0.02).weight_decay(0.1)));
  }
};

void fit_steps(ExportNet& model, int64_t max_steps, const std::string& ckpt_path, const fs::path& root) {
  auto data = torch_load(reference_dir() / "resume_data.pt").toGenericDict();
  TensorLoader loader(data.at("x").toTensor(), data.at("y").toTensor(), {.batch_size = 8});
  Trainer trainer({.accelerator = "cpu",
                   .logger = false,
                   .max_epochs = 100,
                   .max_steps = max_steps,
                   .enable_checkpointing = false,
                   .enable_progress_bar = false,
                   .enable_model_summary = false,
                   .default_root_dir = root.string()});
  trainer.fit(model, loader, FitOptions{ckpt_path});
  if (ckpt_path.empty()) trainer.save_checkpoint((root / "run.ckpt").string());
}

class LightningExport : public ::testing::TestWithParam<std::string> {};

TEST_P(LightningExport, PythonsNextStepFromItIsFulgors) {
  const std::string name = GetParam();
  ScratchDir dir("lightning_export_" + name);
  torch::manual_seed(7);
  ExportNet trained(name);
  fit_steps(trained, kStepsBeforeExport, "", dir.path());

  ExportNet exporter(name);
  LightningCheckpointOptions options;
  options.prefix = "model.";
  auto report =
      export_lightning_checkpoint(exporter, dir.path() / "run.ckpt", dir.path() / "run_lightning.ckpt", options);
  EXPECT_TRUE(report.left_out.empty()) << report.left_out[0];
  std::string output;
  ASSERT_EQ(run_python(
                fmt::format("{}/lightning_export.py check {} {} {} {}", FULGOR_INTEROP_SCRIPTS,
                            (dir.path() / "run_lightning.ckpt").string(), (reference_dir() / "resume_data.pt").string(),
                            name, (dir.path() / "python_next.pt").string()),
                &output),
            0)
      << output;

  ExportNet continued(name);
  fit_steps(continued, kStepsBeforeExport + 1, (dir.path() / "run.ckpt").string(), dir.path());
  StateDict python = state_dict_from(torch_load(dir.path() / "python_next.pt"), "python_next.pt");
  StateDict fulgor = state_dict_of(continued);
  StateDict exported = state_dict_of(trained);
  ASSERT_EQ(python.size(), fulgor.size());
  for (const auto& entry : python) {
    EXPECT_TRUE(torch::allclose(fulgor[entry.key()], entry.value(), 1e-5, 1e-6)) << entry.key() << " " << output;
    EXPECT_FALSE(torch::allclose(exported[entry.key()], entry.value(), 1e-5, 1e-6))
        << entry.key() << ": the step changed nothing";
  }
}

INSTANTIATE_TEST_SUITE_P(Interop, LightningExport, ::testing::Values("sgd", "adam", "adamw"));

TEST(LightningExportSchedulers, LeavesOutASchedulersStateTorchKeepsOtherwise) {
  ScratchDir dir("lightning_export_schedulers");
  ExportNet model("sgd");
  auto sgd = std::make_shared<torch::optim::SGD>(model.parameters(), torch::optim::SGDOptions(0.1));
  OptimizerConfig optim({sgd}, {SchedulerConfig{std::make_shared<StepLR>(*sgd, 2)},
                                SchedulerConfig{std::make_shared<ReduceLROnPlateau>(*sgd)},
                                SchedulerConfig{std::make_shared<StepLR>(*sgd, 3)}});
  auto report = save_lightning_checkpoint(model, optim, dir.path() / "out.ckpt");
  ASSERT_EQ(report.left_out.size(), 2u);
  EXPECT_EQ(report.left_out[0],
            "lr_schedulers[1]: fulgor::ReduceLROnPlateau's state has no torch counterpart fulgor writes");
  EXPECT_EQ(report.left_out[1], "lr_schedulers[2]: fulgor::StepLR, after one left out");
  auto ckpt = torch_load(dir.path() / "out.ckpt").toGenericDict();
  EXPECT_EQ(ckpt.at("lr_schedulers").toListRef().size(), 1u);
  EXPECT_EQ(ckpt.at("lr_schedulers").toListRef()[0].toGenericDict().at("_step_count").toInt(), 1);
  EXPECT_EQ(ckpt.at("state_dict").toGenericDict().size(), 4u);
  EXPECT_TRUE(ckpt.at("state_dict").toGenericDict().contains(std::string("net.0.weight")));

  LightningCheckpointOptions options;
  options.hyper_parameters = nlohmann::json::array({1, 2});
  try {
    save_lightning_checkpoint(model, optim, dir.path() / "bad.ckpt", options);
    ADD_FAILURE() << "wrote hyper-parameters that are not an object";
  } catch (const InteropError& e) {
    EXPECT_NE(std::string(e.what()).find("hyper_parameters is a JSON array; accepted: an object"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fulgor::interop_test
