// Distributed checkpoints crossing to and from PyTorch: folders that
// python3-torch's torch.distributed.checkpoint saved at one and two ranks
// (tests/interop/distributed_checkpoint.py, the interop_dcp_files fixture)
// read here bit for bit and continued here as PyTorch continues them; what
// fulgor saves read by PyTorch's load and dcp_to_torch_save; Lightning's
// sharded layout read as Lightning writes it.

#include <fmt/format.h>
#include <fulgor/core/error.h>
#include <fulgor/data/tensor_loader.h>
#include <fulgor/detail/compat.h>
#include <fulgor/interop/distributed_checkpoint.h>
#include <fulgor/interop/optimizer_state.h>
#include <fulgor/interop/torch_load.h>
#include <fulgor/module.h>
#include <fulgor/trainer.h>

#include <map>

#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

std::string script() { return std::string(FULGOR_INTEROP_SCRIPTS) + "/distributed_checkpoint.py"; }

bool same_value(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTensor() || b.isTensor())
    return a.isTensor() && b.isTensor() && a.toTensor().scalar_type() == b.toTensor().scalar_type() &&
           a.toTensor().sizes() == b.toTensor().sizes() && torch::equal(a.toTensor(), b.toTensor());
  if ((a.isList() || a.isTuple()) && (b.isList() || b.isTuple())) {
    auto x = a.isList() ? a.toListRef().vec() : a.toTupleRef().elements().vec();
    auto y = b.isList() ? b.toListRef().vec() : b.toTupleRef().elements().vec();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!same_value(x[i], y[i])) return false;
    return true;
  }
  if (a.isDouble() && b.isDouble()) return a.toDouble() == b.toDouble();
  if (a.isInt() && b.isInt()) return a.toInt() == b.toInt();
  if (a.isString() && b.isString()) return a.toStringRef() == b.toStringRef();
  if (a.isBool() && b.isBool()) return a.toBool() == b.toBool();
  return a.isNone() && b.isNone();
}

// Every key of `expected`, flattened as DCP flattens it, holds the same
// value in `read` (nested by its planner_data, or flat where the folder has
// none, as torch 1.13's prototype writes it).
void expect_same_state(const c10::IValue& read, const c10::IValue& expected) {
  std::map<std::string, c10::IValue> got;
  for (const auto& entry : flatten_state_dict(read)) got[entry.fqn()] = entry.value;
  size_t compared = 0;
  for (const auto& entry : flatten_state_dict(expected)) {
    auto found = got.find(entry.fqn());
    ASSERT_NE(found, got.end()) << "no " << entry.fqn();
    EXPECT_TRUE(same_value(found->second, entry.value)) << entry.fqn();
    ++compared;
  }
  EXPECT_EQ(compared, got.size()) << "keys PyTorch did not save";
}

TEST(DistributedCheckpointPyTorch, ReadsWhatPyTorchSavedAtOneAndTwoRanks) {
  c10::IValue expected = torch_load(reference_dir() / "dcp_expected.pt");
  for (const char* folder : {"dcp_one", "dcp_two"}) {
    SCOPED_TRACE(folder);
    expect_same_state(read_distributed_checkpoint(reference_dir() / folder), expected);
  }
}

// The network of STATE (distributed_checkpoint.py) with its weights loaded
// from PyTorch's 2-rank folder, and LibTorch's Adam, then the 5 steps of
// CONTINUE; `with_state`: the Adam state of the folder imported first.
torch::nn::Sequential continued_here(bool with_state) {
  torch::nn::Sequential net(torch::nn::Linear(5, 3), torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})),
                            torch::nn::Linear(3, 1));
  net->to(torch::kFloat64);
  DistributedStateDict weights;
  for (const auto& item : net->named_parameters())
    weights.push_back({{std::string("model"), item.key()}, item.value(), std::nullopt});
  load_distributed_checkpoint(weights, reference_dir() / "dcp_two");
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01).betas({0.9, 0.99}));
  if (with_state) {
    // Loaded into the structure of PyTorch's state_dict(), as Python's
    // dcp.load fills a state dict (torch 1.13's folders record no nesting).
    DistributedStateDict optim;
    for (auto& entry : flatten_state_dict(torch_load(reference_dir() / "dcp_expected.pt"))) {
      if (entry.path[0].toStringRef() != "optim") continue;
      if (entry.value.isTensor()) entry.value = torch::zeros_like(entry.value.toTensor());
      optim.push_back(entry);
    }
    load_distributed_checkpoint(optim, reference_dir() / "dcp_two");
    import_optimizer_state(adam, unflatten_state_dict(optim).toGenericDict().at("optim"), "dcp_two");
  }
  torch::Generator gx = at::detail::createCPUGenerator(7), gy = at::detail::createCPUGenerator(8);
  torch::Tensor x = torch::randn({8, 5}, gx, torch::kFloat64), y = torch::randn({8, 1}, gy, torch::kFloat64);
  for (int step = 0; step < 5; ++step) {
    adam.zero_grad();
    torch::mse_loss(net->forward(x), y).backward();
    adam.step();
  }
  return net;
}

// Bit for bit against torch 1.13's Adam. torch 2.x's moves exp_avg with
// lerp_ where LibTorch's (and 1.13's) multiplies and adds, which differ in
// the last bits (src/optim/step_kernels.cpp): within 1e-12 there, far from
// the same run without the folder's Adam state.
TEST(DistributedCheckpointPyTorch, ContinuesPyTorchsTraining) {
  c10::IValue continued = torch_load(reference_dir() / "dcp_continued.pt");
  auto within = [&](const torch::nn::Sequential& net, double tolerance) {
    bool all = true;
    for (const auto& item : net->named_parameters()) {
      torch::Tensor want = continued.toGenericDict().at(item.key()).toTensor();
      all = all && (tolerance == 0 ? torch::equal(item.value(), want)
                                   : torch::allclose(item.value(), want, tolerance, 0));
    }
    return all;
  };
  torch::nn::Sequential net = continued_here(true);
  EXPECT_TRUE(within(net, 1e-12));
  if (!FULGOR_TORCH_AT_LEAST(2, 0)) {
    EXPECT_TRUE(within(net, 0)) << "not bit-equal to torch 1.13's Adam";
  }
  EXPECT_FALSE(within(continued_here(false), 1e-6)) << "the folder's Adam state changes nothing";
}

// fulgor saves PyTorch's state with every tensor of two dimensions or more
// and two rows or more cut in two pieces; PyTorch's load and dcp_to_torch_save read it.
TEST(DistributedCheckpointPyTorch, PyTorchReadsWhatFulgorSaved) {
  ScratchDir dir("dcp_to_pytorch");
  DistributedStateDict state;
  for (auto& entry : flatten_state_dict(torch_load(reference_dir() / "dcp_expected.pt"))) {
    if (!entry.value.isTensor() || entry.value.toTensor().dim() < 2 || entry.value.toTensor().size(0) < 2) {
      state.push_back(entry);
      continue;
    }
    torch::Tensor whole = entry.value.toTensor();
    int64_t half = whole.size(0) / 2;
    for (auto [begin, length] : {std::pair<int64_t, int64_t>{0, half}, {half, whole.size(0) - half}})
      state.push_back({entry.path, whole.narrow(0, begin, length),
                       TensorPlacement{{begin, 0}, whole.sizes().vec()}});
  }
  save_distributed_checkpoint(state, dir.path() / "ckpt");
  std::string output;
  int status = run_python(fmt::format("{} check {} {}", script(), (dir.path() / "ckpt").string(),
                                      (reference_dir() / "dcp_expected.pt").string()),
                          &output);
  if (status == 77) GTEST_SKIP() << output;
  EXPECT_EQ(status, 0) << output;
}

// Lightning's FSDPStrategy(state_dict_type="sharded"): a DCP folder of
// {"model", "optimizer_0"} and meta.pt, the rest of the Trainer's dict.
TEST(DistributedCheckpointPyTorch, ReadsLightningsShardedLayout) {
  fs::path folder = reference_dir() / "lightning_sharded.ckpt";
  if (!fs::exists(folder / "meta.pt"))
    GTEST_SKIP() << "the interop_dcp_lightning_files fixture wrote no Lightning folder: this python3-torch "
                    "has no sharded FSDP state dicts (torch 1.13)";
  EXPECT_TRUE(is_distributed_checkpoint(folder));
  expect_same_state(read_distributed_checkpoint(folder), torch_load(reference_dir() / "lightning_expected.pt"));
  c10::IValue meta = torch_load(folder / "meta.pt");
  EXPECT_TRUE(meta.toGenericDict().contains("global_step"));
  EXPECT_TRUE(meta.toGenericDict().contains("loops"));
}

// The network of STATE as Lightning's module holds it (LitModule's
// self.model: "model.0.weight", ...), trained with STATE's Adam.
struct LitNetwork : Module {
  torch::nn::Sequential model{nullptr};
  LitNetwork() {
    model = register_module(
        "model", torch::nn::Sequential(torch::nn::Linear(5, 3), torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})),
                                       torch::nn::Linear(3, 1)));
    to(torch::kFloat64);
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    return torch::mse_loss(model->forward(batch.data), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01).betas({0.9, 0.99}));
  }
};

// Note [Lightning's sharded checkpoints]: a fit resumes from the folder
// (meta.pt: epoch 0 of 3 steps done; the optimizer's state by parameter
// names) and trains epochs 1 to 5 on CONTINUE's one batch: PyTorch's 5
// steps from the same state, within what torch 2.x's lerp_ explains.
TEST(DistributedCheckpointPyTorch, FitResumesLightningsShardedCheckpoint) {
  const fs::path folder = reference_dir() / "lightning_sharded.ckpt";
  if (!fs::exists(folder / "meta.pt"))
    GTEST_SKIP() << "the interop_dcp_lightning_files fixture wrote no Lightning folder: this python3-torch "
                    "has no sharded FSDP state dicts (torch 1.13)";
  ScratchDir dir("lightning_sharded_fit");
  torch::Generator gx = at::detail::createCPUGenerator(7), gy = at::detail::createCPUGenerator(8);
  TensorLoader loader(torch::randn({8, 5}, gx, torch::kFloat64), torch::randn({8, 1}, gy, torch::kFloat64),
                      {.batch_size = 8});
  TrainerOptions options;
  options.accelerator = "cpu";
  options.devices = 1;
  options.max_epochs = 6;
  options.logger = false;
  options.enable_checkpointing = false;
  options.enable_progress_bar = false;
  options.enable_model_summary = false;
  options.default_root_dir = dir.path().string();
  LitNetwork net;
  Trainer trainer(options);
  trainer.fit(net, loader, {.ckpt_path = folder.string()});
  EXPECT_EQ(trainer.global_step(), 3 + 5);
  const c10::IValue continued = torch_load(reference_dir() / "dcp_continued.pt");
  for (const auto& item : net.model->named_parameters())
    EXPECT_TRUE(torch::allclose(item.value(), continued.toGenericDict().at(item.key()).toTensor(), 1e-12, 0))
        << item.key();
}

}  // namespace
}  // namespace fulgor::interop_test
