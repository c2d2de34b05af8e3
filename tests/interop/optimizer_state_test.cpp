// Continuing in fulgor a run begun in Python: torch.optim's SGD, Adam and
// AdamW states (tests/interop/optim_resume.py) become LibTorch optimizer
// state, and fit(ckpt_path) takes the steps Python takes.

#include <fulgor/fulgor.h>
#include <fulgor/interop/optimizer_state.h>

#include "fulgor/detail/compat.h"
#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

const nlohmann::json& resume_report() {
  static const nlohmann::json json = [] {
    std::ifstream in(reference_dir() / "resume.json");
    if (!in) throw std::runtime_error("no resume.json: run ctest, whose interop_resume_files fixture writes it");
    return nlohmann::json::parse(in);
  }();
  return json;
}

// optim_resume.py's Net; the optimizers start with hyper-parameters that are
// not Python's, which the import must replace.
struct ResumeNet : Module {
  torch::nn::Sequential net{torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2)};
  std::string optimizer;
  explicit ResumeNet(std::string kind) : optimizer(std::move(kind)) { register_module("net", net); }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::mse_loss(net->forward(batch.data), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    if (optimizer == "sgd") {
      auto sgd = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1.0));
      return OptimizerConfig(sgd, SchedulerConfig{std::make_shared<StepLR>(*sgd, 4, 0.5), Interval::step});
    }
    if (optimizer == "sgd_nesterov")
      return OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(1.0)));
    if (optimizer == "adam")
      return OptimizerConfig(std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1.0)));
    return OptimizerConfig(std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(1.0)));
  }
};

StateDict tensors_of(const std::string& file) { return state_dict_from(torch_load(reference_dir() / file), file); }

// Fits `model` from `ckpt_path` to Python's step count plus M, on Python's batches.
void continue_fit(ResumeNet& model, const std::string& ckpt_path, int64_t start, const std::string& root,
                  bool deterministic = false) {
  StateDict data = tensors_of("resume_data.pt");
  TensorLoader loader(data["x"], data["y"], {.batch_size = resume_report()["batch_size"].get<int64_t>()});
  Trainer trainer({.accelerator = "cpu",
                   .logger = false,
                   .max_epochs = 100,
                   .max_steps = start + resume_report()["m"].get<int64_t>(),
                   .enable_checkpointing = false,
                   .enable_progress_bar = false,
                   .enable_model_summary = false,
                   .deterministic = deterministic,
                   .default_root_dir = root});
  FitResult result = trainer.fit(model, loader, FitOptions{ckpt_path});
  EXPECT_EQ(result.reason, StopReason::max_steps) << result.message;
}

void expect_weights(const ResumeNet& model, const std::string& file, bool equal) {
  StateDict want = tensors_of(file);
  StateDict got = state_dict_of(model);
  ASSERT_EQ(got.size(), want.size());
  bool all_close = true;
  for (const auto& entry : want) all_close = all_close && torch::allclose(got[entry.key()], entry.value(), 1e-5, 1e-6);
  EXPECT_EQ(all_close, equal) << file << (equal ? ": fulgor's weights are not Python's" : ": the same without state");
}

class PythonRunContinued : public ::testing::TestWithParam<std::string> {};

TEST_P(PythonRunContinued, TakesTheStepsPythonTakes) {
  const std::string name = GetParam();
  const auto& report = resume_report()["cases"][name];
  ScratchDir dir("resume_" + name);
  ResumeNet model(name);
  continue_fit(model, (reference_dir() / report["file"].get<std::string>()).string(), report["start"].get<int64_t>(),
               dir.path().string());
  expect_weights(model, "resume_" + name + "_after.pt", true);
}

INSTANTIATE_TEST_SUITE_P(Interop, PythonRunContinued, ::testing::Values("sgd", "sgd_nesterov", "adam", "adamw"));

// Python's file holds no module state of fulgor's nor any of its generators:
// the module's on_load_checkpoint is not called, and deterministic=true, which
// refuses a fulgor checkpoint without its generator states, continues it
// without a word, to Python's weights.
TEST(PythonRunContinued, ReadsNoStateOnlyFulgorWrites) {
  struct CountingNet : ResumeNet {
    using ResumeNet::ResumeNet;
    void on_load_checkpoint(const nlohmann::json&) override { ++loads; }
    int loads = 0;
  };
  const auto& report = resume_report()["cases"]["adam"];
  ScratchDir dir("resume_no_fulgor_state");
  CountingNet model("adam");
  ::testing::internal::CaptureStderr();
  continue_fit(model, (reference_dir() / report["file"].get<std::string>()).string(), report["start"].get<int64_t>(),
               dir.path().string(), /*deterministic=*/true);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(said.find("generator state"), std::string::npos) << said;
  EXPECT_EQ(model.loads, 0);
  expect_weights(model, "resume_adam_after.pt", true);
}

TEST(PythonRunContinuedWithoutState, DiffersFromPython) {
  // The weights alone, the optimizer's moments afresh: the test above would see it.
  ScratchDir dir("resume_weights_only");
  ResumeNet model("adamw");
  load_state_dict(model, reference_dir() / "resume_adamw.pt");
  continue_fit(model, "", 0, dir.path().string());
  expect_weights(model, "resume_adamw_after.pt", false);
}

TEST(ImportOptimizerState, CopiesAdamsStateAndHyperParameters) {
  ResumeNet model("adam");
  auto optimizer = model.configure_optimizers().optimizers[0];
  import_optimizer_state(*optimizer, reference_dir() / "resume_adam.ckpt");
  const auto& options = static_cast<const torch::optim::AdamOptions&>(optimizer->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(options.lr(), 0.01);
  EXPECT_DOUBLE_EQ(std::get<0>(options.betas()), 0.8);
  EXPECT_DOUBLE_EQ(options.weight_decay(), 0.01);
  EXPECT_TRUE(options.amsgrad());
  c10::IValue ckpt = torch_load(reference_dir() / "resume_adam.ckpt");
  auto states = ckpt.toGenericDict().at("optimizer_states").toListRef()[0].toGenericDict().at("state").toGenericDict();
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(i);
    auto* state =
        dynamic_cast<torch::optim::AdamParamState*>(detail::compat::optimizer_param_state(*optimizer, params[i]));
    ASSERT_NE(state, nullptr);
    auto python = states.at(static_cast<int64_t>(i)).toGenericDict();
    EXPECT_EQ(state->step(), resume_report()["n"].get<int64_t>());
    EXPECT_TRUE(torch::equal(state->exp_avg(), python.at("exp_avg").toTensor()));
    EXPECT_TRUE(torch::equal(state->max_exp_avg_sq(), python.at("max_exp_avg_sq").toTensor()));
  }
}

void expect_refused(torch::optim::Optimizer& optimizer, const std::string& file, const std::string& part) {
  try {
    import_optimizer_state(optimizer, reference_dir() / file);
    ADD_FAILURE() << "imported " << file;
  } catch (const InteropError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

TEST(ImportOptimizerState, NamesWhatDoesNotFit) {
  torch::nn::Sequential wider(torch::nn::Linear(4, 9), torch::nn::Tanh(), torch::nn::Linear(9, 2));
  torch::optim::Adam adam(wider->parameters(), torch::optim::AdamOptions(1.0));
  expect_refused(
      adam, "resume_adam.ckpt",
      "the state of parameter 0 (index 0 of the group)'s \"exp_avg\" has shape [8, 4], the parameter [9, 4]");
  EXPECT_EQ(detail::compat::optimizer_param_state(adam, wider->parameters()[2]), nullptr) << "changed on failure";

  ResumeNet model("sgd");
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(1.0));
  expect_refused(sgd, "resume_adam.ckpt", "param_groups[0] has no \"momentum\"");
  torch::optim::RMSprop rmsprop(model.parameters(), torch::optim::RMSpropOptions(1.0));
  expect_refused(rmsprop, "resume_adam.ckpt", "torch::optim::RMSprop cannot take torch.optim state");
  torch::optim::Adam short_adam(std::vector<torch::Tensor>{model.parameters()[0]}, torch::optim::AdamOptions(1.0));
  expect_refused(short_adam, "resume_adam.ckpt", "param_groups[0] has 4 parameters, the optimizer's group 1");
  expect_refused(adam, "resume_data.pt", "holds 0 optimizer states");
}

TEST(PythonRunContinued, RefusesAFileWithoutOptimizerState) {
  ScratchDir dir("resume_no_state");
  ResumeNet model("adam");
  try {
    continue_fit(model, (reference_dir() / "resume_adam_after.pt").string(), 0, dir.path().string());
    ADD_FAILURE() << "resumed without optimizer state";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 0 torch.optim states; configure_optimizers returned 1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fulgor::interop_test
