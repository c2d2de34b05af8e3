// fulgor::Fabric in one process: a hand-written loop and its Fabric version
// train bit for bit alike; checkpoints of a named state; collectives, logging
// and precision on one process; what Fabric refuses.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "../distributed/support/spawn.h"
#include "../support/launcher_variables.h"
#include "../support/python_reference.h"
#include "../support/thrown.h"
#include "fabric_loops.h"   // docs/ways_in.md's loops
#include "fabric_resume.h"  // and its resumable one
#include "fulgor/fulgor.h"
#include "fulgor/interop/distributed_checkpoint.h"

namespace {

using fulgor::test::TempDir;

torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
}

std::pair<torch::Tensor, torch::Tensor> make_data() {
  torch::Generator generator = at::detail::createCPUGenerator(3);
  return {torch::randn({96, 6}, generator), torch::randn({96, 3}, generator)};
}

fulgor::TensorLoaderOptions shuffled() {
  fulgor::TensorLoaderOptions options;
  options.batch_size = 8;
  options.shuffle = true;
  options.seed = 5;
  return options;
}

torch::optim::SGD make_sgd(torch::nn::Sequential& net) {
  return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
}

constexpr int64_t kEpochs = 3, kAccumulate = 2;

// The loop a LibTorch program writes: accumulation over two batches, the
// gradients' norm clipped before each step.
std::vector<torch::Tensor> plain_loop() {
  auto net = make_net();
  auto sgd = make_sgd(net);
  auto [x, y] = make_data();
  fulgor::TensorLoader loader(x, y, shuffled());
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    int64_t i = 0;
    for (auto& batch : loader) {
      torch::Tensor loss = torch::mse_loss(net->forward(batch.data), batch.target) / kAccumulate;
      loss.backward();
      if (++i % kAccumulate == 0) {
        torch::nn::utils::clip_grad_norm_(net->parameters(), 0.5);
        sgd.step();
        sgd.zero_grad();
      }
    }
  }
  return net->parameters();
}

// The same loop, converted.
std::vector<torch::Tensor> fabric_loop() {
  fulgor::Fabric fabric({.accelerator = "cpu", .devices = 1});
  fabric.launch();
  auto net = make_net();
  auto sgd = make_sgd(net);
  auto optimizer = fabric.setup(net, sgd);
  auto [x, y] = make_data();
  auto loader = fabric.setup_dataloaders(fulgor::TensorLoader(x, y, shuffled()));
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    int64_t i = 0;
    for (auto& batch : loader) {
      const bool steps = (i + 1) % kAccumulate == 0;
      {
        auto no_sync = fabric.no_backward_sync(*net, !steps);
        fabric.backward(torch::mse_loss(net->forward(batch.data), batch.target) / kAccumulate);
      }
      if (++i % kAccumulate == 0) {
        fabric.clip_gradients(*net, optimizer, {.max_norm = 0.5});
        optimizer.step();
        optimizer.zero_grad();
      }
    }
  }
  EXPECT_EQ(fabric.strategy(), "single_device");
  EXPECT_EQ(fabric.world_size(), 1);
  EXPECT_TRUE(fabric.is_global_zero());
  EXPECT_EQ(fabric.device(), torch::Device(torch::kCPU));
  return net->parameters();
}

TEST(Fabric, ConvertedLoopTrainsBitForBitAsThePlainLoop) {
  const auto plain = plain_loop();
  const auto fabric = fabric_loop();
  ASSERT_EQ(plain.size(), fabric.size());
  bool changed = false;
  const auto initial = make_net()->parameters();
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i], fabric[i])) << "parameter " << i;
    changed = changed || !torch::equal(plain[i], initial[i]);
  }
  EXPECT_TRUE(changed) << "training changed nothing";
}

TEST(Fabric, TheDocsLoopsTrainAlike) {
  auto [x, y] = make_data();
  const auto plain = train_plain(x, y), fabric = train_with_fabric(x, y);
  ASSERT_EQ(plain.size(), fabric.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], fabric[i])) << "parameter " << i;
}

// LibTorch's loader, its shuffle and dropout drawing from the global
// generator: stopped after 2 epochs and resumed, as after 4 in one go.
TEST(Fabric, TheDocsResumableLoopResumesExactly) {
  TempDir dir;
  auto [x, y] = make_data();
  const auto whole = train_resumable(x, y, 4, dir / "whole.ckpt");
  const auto half = train_resumable(x, y, 2, dir / "resumed.ckpt");
  const auto resumed = train_resumable(x, y, 4, dir / "resumed.ckpt");
  ASSERT_EQ(whole.size(), resumed.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_TRUE(torch::equal(whole[i], resumed[i])) << "parameter " << i;
    EXPECT_FALSE(torch::equal(whole[i], half[i])) << "parameter " << i << " did not change in epochs 3 and 4";
  }
}

TEST(Fabric, OneProcessNeedsNoLaunchAndItsCollectivesAreIdentities) {
  fulgor::Fabric fabric({.accelerator = "cpu"});
  const torch::Tensor t = torch::arange(4.0);
  EXPECT_TRUE(torch::equal(fabric.all_reduce(t.clone()), t));
  EXPECT_TRUE(torch::equal(fabric.all_gather(t), t));
  EXPECT_TRUE(torch::equal(fabric.broadcast(t), t));
  EXPECT_EQ(fabric.all_reduce(2.5, fulgor::ReduceOp::sum), 2.5);
  EXPECT_EQ(fabric.broadcast(nlohmann::json{{"a", 1}}), (nlohmann::json{{"a", 1}}));
  fabric.barrier();
  EXPECT_THROW(fabric.launch(), fulgor::Error) << "launch() was called by the first collective already";
}

// How many batches of 32 rows of x a set-up loader gives, checking that each
// is on the Fabric's device and in order.
template <typename Loader>
int64_t batches_in_order_on_device(Loader& loader, const fulgor::Fabric& fabric, const torch::Tensor& x) {
  int64_t batches = 0;
  for (auto& batch : loader) {
    EXPECT_EQ(batch.data.device(), fabric.device());
    EXPECT_TRUE(torch::equal(batch.data, x.narrow(0, 32 * batches, 32)));
    ++batches;
  }
  return batches;
}

TEST(Fabric, BatchesOfASetUpLoaderAreOnTheDevice) {
  fulgor::Fabric fabric({.accelerator = "cpu"});
  auto [x, y] = make_data();
  auto loader = fabric.setup_dataloaders(fulgor::TensorLoader(x, y, {.batch_size = 32}));
  EXPECT_EQ(loader.size(), 3);
  EXPECT_EQ(batches_in_order_on_device(loader, fabric, x), 3);
}

// The loader a LibTorch program has: torch::data::make_data_loader's
// std::unique_ptr, iterated through the Fabric as it is.
TEST(Fabric, TakesLibTorchsOwnDataLoader) {
  fulgor::Fabric fabric({.accelerator = "cpu"});
  auto [x, y] = make_data();
  auto dataset =
      torch::data::datasets::TensorDataset({x}).map(torch::data::transforms::Stack<torch::data::TensorExample>());
  auto loader = fabric.setup_dataloaders(
      torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(std::move(dataset), 32));
  EXPECT_EQ(batches_in_order_on_device(loader, fabric, x), 3);
}

TEST(Fabric, AutocastComputesInTheMixedPrecisionsType) {
  fulgor::Fabric fabric({.accelerator = "cpu", .precision = "bf16-mixed"});
  auto net = make_net();
  fabric.setup(net);
  const torch::Tensor x = torch::randn({4, 6});
  {
    auto autocast = fabric.autocast();
    EXPECT_EQ(net->forward(x).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(net->forward(x).scalar_type(), torch::kFloat);
  EXPECT_EQ(fabric.grad_scaler(), nullptr) << "only 16-mixed scales the loss";
  // The parameters stay float32 under a mixed precision.
  EXPECT_EQ(net->parameters()[0].scalar_type(), torch::kFloat);
}

// A mixed precision needs the forward pass under autocast, which Fabric
// cannot wrap around a C++ module's forward: a step without it is said, once.
TEST(Fabric, MixedPrecisionWithoutAutocastIsSaidOnce) {
  const auto stderr_of = [](bool with_autocast) {
    fulgor::Fabric fabric({.accelerator = "cpu", .precision = "bf16-mixed"});
    auto net = make_net();
    auto sgd = make_sgd(net);
    fabric.setup(net, sgd);
    auto [x, y] = make_data();
    testing::internal::CaptureStderr();
    for (int step = 0; step < 3; ++step) {
      torch::Tensor loss;
      if (with_autocast) {
        auto autocast = fabric.autocast();
        loss = torch::mse_loss(net->forward(x), y);
      } else {
        loss = torch::mse_loss(net->forward(x), y);
      }
      fabric.backward(loss);
    }
    return testing::internal::GetCapturedStderr();
  };
  const std::string without = stderr_of(false), with = stderr_of(true);
  const std::string warning = "precision 'bf16-mixed': no fabric.autocast() scope was open since the last backward";
  EXPECT_NE(without.find(warning), std::string::npos) << without;
  EXPECT_EQ(without.find(warning), without.rfind(warning)) << "said once: " << without;
  EXPECT_EQ(with.find(warning), std::string::npos) << with;
}

// Lightning Fabric's callbacks: hooks named by fabric.call, run in order on
// the callbacks that have them; a call with other argument types is refused.
TEST(Fabric, CallRunsTheNamedHookOfEachCallback) {
  struct Recorder : fulgor::FabricCallback {
    explicit Recorder(std::vector<std::string>& said, std::string who) {
      hook("on_train_epoch_end", [&said, who](int64_t epoch, double loss) {
        said.push_back(who + " " + std::to_string(epoch) + " " + std::to_string(loss));
      });
    }
  };
  struct Quiet : fulgor::FabricCallback {};
  std::vector<std::string> said;
  fulgor::Fabric fabric({.accelerator = "cpu",
                         .callbacks = {std::make_shared<Recorder>(said, "a"), std::make_shared<Quiet>(),
                                       std::make_shared<Recorder>(said, "b")}});
  fabric.call("on_train_epoch_end", int64_t{3}, 0.5);
  fabric.call("on_validation_end");
  EXPECT_EQ(said, (std::vector<std::string>{"a 3 0.500000", "b 3 0.500000"}));
  EXPECT_EQ(fabric.callbacks().size(), 3u);
  EXPECT_NE(fulgor::test::thrown_message<fulgor::ConfigError>([&] {
              fabric.call("on_train_epoch_end", 3, 0.5);
            }).find("fabric.call('on_train_epoch_end'): the callback's hook of that name takes other argument types"),
            std::string::npos);
  EXPECT_THROW(fulgor::Fabric({.accelerator = "cpu", .callbacks = {nullptr}}), fulgor::ConfigError);
}

TEST(Fabric, LaunchRunsAFunctionAndRankZeroFirstRunsOnOneProcess) {
  fulgor::Fabric fabric({.accelerator = "cpu"});
  const int64_t world = fabric.launch([](fulgor::Fabric& f) { return f.world_size(); });
  EXPECT_EQ(world, 1);
  int runs = 0;
  fabric.rank_zero_first([&] { ++runs; });
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(fabric.new_group({0}).has_value()) << "one process has no group to make";
  EXPECT_THROW(fabric.new_group({0, 1}), fulgor::ConfigError);
}

// init_module: parameters made in a "-true" precision's dtype, and the
// default dtype back afterwards.
TEST(Fabric, InitModuleMakesParametersInThePrecisionsDtype) {
  fulgor::Fabric fabric({.accelerator = "cpu", .precision = "bf16-true"});
  torch::nn::Linear made_in_bf16{nullptr};
  {
    auto init = fabric.init_module();
    made_in_bf16 = torch::nn::Linear(4, 3);
    EXPECT_EQ(torch::ones({2}).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(made_in_bf16->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(torch::ones({2}).scalar_type(), torch::kFloat);
  fulgor::Fabric fp32({.accelerator = "cpu"});
  auto init = fp32.init_tensor();
  EXPECT_EQ(torch::ones({2}).scalar_type(), torch::kFloat) << "32-true changes nothing";
}

// Nested collections go through the collectives whole; on one process as they are.
TEST(Fabric, CollectivesTakeCollectionsOfTensors) {
  fulgor::Fabric fabric({.accelerator = "cpu"});
  std::map<std::string, std::vector<torch::Tensor>> nested{{"a", {torch::ones({2}), torch::arange(3.0)}}};
  const auto reduced = fabric.all_reduce(nested);
  EXPECT_TRUE(torch::equal(reduced.at("a")[1], torch::arange(3.0)));
  const auto pair = fabric.broadcast(std::make_pair(torch::ones({1}), std::make_tuple(torch::zeros({1}))));
  EXPECT_TRUE(torch::equal(std::get<0>(pair.second), torch::zeros({1})));
  EXPECT_EQ(fabric.all_gather(std::vector<torch::Tensor>{torch::ones({2})}).size(), 1u);
}

TEST(Fabric, TruePrecisionConvertsTheModule) {
  fulgor::Fabric fabric({.accelerator = "cpu", .precision = "64-true"});
  auto net = make_net();
  fabric.setup(net);
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kDouble);
}

// The Trainer's rules and messages (src/config/trainer_options.cpp).
TEST(Fabric, RefusesShardingOptionsAsTheTrainer) {
  auto refusal = [](const fulgor::FabricOptions& options) {
    return fulgor::test::thrown_message<fulgor::ConfigError>([&] { fulgor::Fabric fabric(options); });
  };
  EXPECT_NO_THROW(fulgor::Fabric({.accelerator = "cpu", .strategy = "fsdp"}));  // FULL_SHARD, Lightning's default
  EXPECT_NO_THROW(fulgor::Fabric({.accelerator = "cpu", .strategy = "fsdp", .sharding_strategy = "hybrid_shard"}));
  EXPECT_EQ(refusal({.accelerator = "cpu", .strategy = "fsdp", .sharding_strategy = "full"}),
            "unknown sharding_strategy 'FULL'; known: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD");
  EXPECT_EQ(refusal({.accelerator = "cpu",
                     .strategy = "fsdp",
                     .sharding_strategy = "shard_grad_op",
                     .zero_redundancy_optimizer = true}),
            "zero_redundancy_optimizer=true shards the optimizers' state under strategy \"ddp\", not \"fsdp\" (fsdp "
            "shards it already)");
}

// On one process there is nothing to shard: the loop runs as single_device.
TEST(Fabric, ShardedStrategyOnOneProcessTrainsAlone) {
  fulgor::Fabric fabric({.accelerator = "cpu", .strategy = "fsdp", .sharding_strategy = "SHARD_GRAD_OP"});
  EXPECT_EQ(fabric.strategy(), "single_device");
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto optimizer = fabric.setup(net, sgd);
  const auto [x, y] = make_data();
  fabric.backward(torch::mse_loss(net->forward(x), y));
  EXPECT_TRUE(fabric.clip_gradients(*net, optimizer, {.max_norm = 1.0}).has_value());
  EXPECT_TRUE(optimizer.step());
}

TEST(Fabric, RefusesWhatLightningRefuses) {
  EXPECT_THROW(fulgor::Fabric({.accelerator = "cpu", .precision = "8-true"}), fulgor::ConfigError);
  EXPECT_THROW(fulgor::Fabric({.accelerator = "cpu", .devices = 2, .strategy = "single_device"}), fulgor::ConfigError);
  EXPECT_THROW(fulgor::Fabric({.accelerator = "cpu", .num_nodes = 0}), fulgor::ConfigError);
  EXPECT_THROW(fulgor::Fabric({.accelerator = "cpu", .num_nodes = 2}), fulgor::ConfigError);
  {
    // TorchElasticEnvironment.validate_settings: one device, a launcher's two processes.
    fulgor::test::LauncherVariables torchrun(fulgor::test::torchrun_rank_zero(2));
    EXPECT_EQ(
        fulgor::test::thrown_message<fulgor::ConfigError>([] { fulgor::Fabric({.accelerator = "cpu", .devices = 1}); }),
        "devices=1 selects 1 device per node, but the launcher (torchrun) started 2 processes on this node: set "
        "devices=2 (or \"auto\") to train on what the launcher started");
  }
  fulgor::Fabric fabric({.accelerator = "cpu"});
  auto net = make_net();
  auto sgd = make_sgd(net);
  fabric.setup(net, sgd);
  EXPECT_THROW(fabric.setup(net), fulgor::ConfigError);
  EXPECT_THROW(fabric.setup_optimizers(sgd), fulgor::ConfigError);
  auto other = make_net();
  EXPECT_THROW((void)fabric.no_backward_sync(*other), fulgor::ConfigError);
  EXPECT_THROW(fabric.clip_gradients(*net, sgd, {}), fulgor::ConfigError);
  EXPECT_THROW(fabric.clip_gradients(*net, sgd, {.clip_val = 1.0, .max_norm = 1.0}), fulgor::ConfigError);
}

TEST(Fabric, ClipGradientsByValueAndByNorm) {
  fulgor::Fabric fabric({.accelerator = "cpu"});
  auto net = make_net();
  auto sgd = make_sgd(net);
  fabric.setup(net, sgd);
  auto [x, y] = make_data();
  fabric.backward(torch::mse_loss(net->forward(x), y) * 100);
  fabric.clip_gradients(*net, sgd, {.clip_val = 0.01});
  for (const auto& p : net->parameters()) EXPECT_LE(p.grad().abs().max().item<double>(), 0.01);
  const auto norm = fabric.clip_gradients(*net, sgd, {.max_norm = 0.001});
  ASSERT_TRUE(norm.has_value());
  EXPECT_GT(*norm, 0.001);
  std::vector<torch::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad().reshape({-1}));
  EXPECT_NEAR(torch::cat(grads).norm().item<double>(), 0.001, 1e-6);
  // A non-finite norm is an error unless asked otherwise, as Lightning's default.
  net->parameters()[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(fabric.clip_gradients(*net, sgd, {.max_norm = 1.0}), fulgor::Error);
  EXPECT_NO_THROW(fabric.clip_gradients(*net, sgd, {.max_norm = 1.0, .error_if_nonfinite = false}));
}

// A scheduler-like object with a JSON state, for "anything with a state dict".
struct Counter {
  int64_t count = 0;
  nlohmann::json state_dict() const { return {{"count", count}}; }
  void load_state_dict(const nlohmann::json& state) { count = state.at("count").get<int64_t>(); }
};

// Saves a named state with `state_dict_type` ("full": a file; "sharded": a
// distributed checkpoint's folder), and loads it back.
void save_and_load_a_named_state(const std::string& state_dict_type) {
  TempDir dir;
  const std::string path = dir / "state.ckpt";
  fulgor::Fabric fabric({.accelerator = "cpu", .state_dict_type = state_dict_type});
  auto net = make_net();
  auto sgd = make_sgd(net);
  auto optimizer = fabric.setup(net, sgd);
  auto [x, y] = make_data();
  fabric.backward(torch::mse_loss(net->forward(x), y));
  optimizer.step();
  int64_t step = 7;
  std::string tag = "run-a";
  Counter counter{3};
  torch::Tensor extra = torch::arange(5.0);
  fulgor::GradScaler scaler;
  fabric.save(path, {{"model", net},
                     {"optimizer", sgd},
                     {"step", step},
                     {"tag", tag},
                     {"counter", counter},
                     {"extra", extra},
                     {"scaler", scaler}});
  if (state_dict_type == "full")
    EXPECT_EQ(fulgor::detect_weights_format(path), fulgor::WeightsFormat::fulgor_checkpoint);
  else
    EXPECT_TRUE(fulgor::is_distributed_checkpoint(path));

  auto restored = make_net();
  auto restored_sgd = make_sgd(restored);
  int64_t restored_step = 0;
  std::string restored_tag;
  Counter restored_counter;
  torch::Tensor restored_extra;
  const nlohmann::json remainder = fabric.load(path, {{"model", restored},
                                                      {"optimizer", restored_sgd},
                                                      {"step", restored_step},
                                                      {"counter", restored_counter},
                                                      {"extra", restored_extra}});
  for (size_t i = 0; i < net->parameters().size(); ++i)
    EXPECT_TRUE(torch::equal(net->parameters()[i], restored->parameters()[i]));
  EXPECT_EQ(restored_step, 7);
  EXPECT_EQ(restored_counter.count, 3);
  EXPECT_TRUE(torch::equal(restored_extra, extra));
  EXPECT_EQ(remainder, (nlohmann::json{{"tag", "run-a"}})) << "what the state did not ask for comes back";
  // The momentum buffers came back: both take the same next step.
  for (auto* which : {&net, &restored}) {
    (*which)->zero_grad();
    torch::mse_loss((*which)->forward(x), y).backward();
  }
  sgd.step();
  restored_sgd.step();
  for (size_t i = 0; i < net->parameters().size(); ++i)
    EXPECT_TRUE(torch::equal(net->parameters()[i], restored->parameters()[i]));

  int64_t absent = 0;
  EXPECT_THROW(fabric.load(path, {{"epoch", absent}}), fulgor::CheckpointError);
  EXPECT_NO_THROW(fabric.load(path, {{"epoch", absent}}, /*strict=*/false));
  EXPECT_THROW(fabric.load(path, {{"step", sgd}}), fulgor::CheckpointError) << "a value loaded into an optimizer";
  EXPECT_THROW(fabric.save(path, {{"meta", step}}), fulgor::ConfigError);
  EXPECT_THROW(fabric.save(path, {{"a.b", step}}), fulgor::ConfigError);
  auto wider = torch::nn::Sequential(torch::nn::Linear(6, 32), torch::nn::ReLU(), torch::nn::Linear(32, 3));
  EXPECT_THROW(fabric.load(path, {{"model", wider}}), fulgor::CheckpointError);
}

TEST(Fabric, SaveAndLoadANamedState) { save_and_load_a_named_state("full"); }

TEST(Fabric, SaveAndLoadANamedStateAsAShardedCheckpoint) {
  save_and_load_a_named_state("sharded");
  // What a sharded checkpoint cannot hold is named.
  TempDir dir;
  fulgor::Fabric fabric({.accelerator = "cpu", .state_dict_type = "sharded"});
  auto net = make_net();
  torch::optim::RMSprop rmsprop(net->parameters(), torch::optim::RMSpropOptions(0.01));
  int64_t step = 1;
  EXPECT_NE(fulgor::test::thrown_message<fulgor::ConfigError>([&] {
              fabric.save(dir / "a.ckpt", {{"model", net}, {"optimizer", rmsprop}});
            }).find("'optimizer' is none of them: use state_dict_type=\"full\""),
            std::string::npos);
  EXPECT_NE(fulgor::test::thrown_message<fulgor::ConfigError>([&] {
              fabric.save(dir / "b.ckpt", {{"fulgor", step}});
            }).find("fabric state name 'fulgor' is the sharded checkpoint's own entry"),
            std::string::npos);
  EXPECT_THROW(fulgor::Fabric({.accelerator = "cpu", .state_dict_type = "FULL"}), fulgor::ConfigError);
}

// A folder or a missing file is named as what it is, with the system's reason.
TEST(Fabric, LoadNamesAFolderAndAMissingFileAsWhatTheyAre) {
  TempDir dir;
  fulgor::Fabric fabric({.accelerator = "cpu"});
  auto net = make_net();
  const fulgor::FabricState state{{"model", net}};
  EXPECT_NE(fulgor::test::thrown_message<fulgor::Error>([&] { fabric.load(dir.str(), state); })
                .find("'" + dir.str() + "' is a folder, not a regular file"),
            std::string::npos);
  EXPECT_NE(fulgor::test::thrown_message<fulgor::Error>([&] { fabric.load(dir / "none.ckpt", state); })
                .find("none.ckpt' cannot be opened: No such file or directory"),
            std::string::npos);
}

TEST(Fabric, LoadsATorchSaveCheckpointThroughTheInteropReaders) {
  TempDir dir;
  const std::string script = dir / "make.py";
  std::ofstream(script) << R"(import json, sys, torch
torch.manual_seed(1)
net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
sgd = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
net(torch.randn(4, 6)).sum().backward()
sgd.step()
path = sys.argv[1] + ".pt"
torch.save({"model": net.state_dict(), "optimizer": sgd.state_dict(), "epoch": 4, "note": "python"}, path)
json.dump({"path": path, "bias": net[2].bias.tolist()}, open(sys.argv[1], "w"))
)";
  const nlohmann::json made = fulgor::test::python_reference("/usr/bin/python3", script, "fabric_torch_save");
  fulgor::Fabric fabric({.accelerator = "cpu"});
  auto net = make_net();
  auto sgd = make_sgd(net);
  fabric.setup(net, sgd);
  int64_t epoch = 0;
  const nlohmann::json remainder =
      fabric.load(made.at("path").get<std::string>(), {{"model", net}, {"optimizer", sgd}, {"epoch", epoch}});
  EXPECT_EQ(epoch, 4);
  EXPECT_EQ(remainder, (nlohmann::json{{"note", "python"}}));
  const auto bias = made.at("bias").get<std::vector<float>>();
  EXPECT_TRUE(torch::equal(net->parameters()[3], torch::tensor(bias)));
  auto other = make_net();
  fabric.load_raw(made.at("path").get<std::string>(), *other, /*strict=*/true);
  EXPECT_TRUE(torch::equal(other->parameters()[3], torch::tensor(bias)));
  std::filesystem::remove(made.at("path").get<std::string>());
}

TEST(Fabric, LogsThroughFulgorsLoggers) {
  TempDir dir;
  auto csv = std::make_shared<fulgor::CSVLogger>(dir.str());
  fulgor::Fabric fabric({.accelerator = "cpu", .loggers = {csv}});
  fabric.log("loss", 0.5);
  fabric.log("loss", torch::tensor(0.25));
  fabric.log_dict({{"acc", 0.75}}, 10);
  csv->save();
  std::ifstream in(csv->log_dir() + "/metrics.csv");
  std::string header, first, second, third;
  std::getline(in, header);
  std::getline(in, first);
  std::getline(in, second);
  std::getline(in, third);
  EXPECT_EQ(header, "step,acc,loss");
  EXPECT_EQ(first, "0,,0.5");
  EXPECT_EQ(second, "1,,0.25");
  EXPECT_EQ(third, "10,0.75,");
}

}  // namespace
