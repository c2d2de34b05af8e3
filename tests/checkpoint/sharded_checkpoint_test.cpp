// state_dict_type "sharded" in one process (Note [Sharded training
// checkpoints]): the fit's checkpoints are folders that resume it exactly,
// that ModelCheckpoint keeps, displaces and finds as "last" as it does files,
// and that PyTorch's layout holds; the 2- and 4-rank fits are in
// tests/distributed/sharded_trainer_test.cpp.

#include <torch/optim/rmsprop.h>

#include "../support/thrown.h"
#include "fulgor/callbacks/model_checkpoint.h"
#include "fulgor/interop/distributed_checkpoint.h"
#include "fulgor/interop/lightning_checkpoint.h"
#include "fulgor/interop/torch_load.h"
#include "fulgor/interop/torch_save.h"
#include "support/fitted.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

TrainerOptions sharded(const TempDir& dir, int64_t epochs) {
  auto o = resumable(dir, epochs);
  o.state_dict_type = "sharded";
  return o;
}

// Saved mid-epoch and resumed, with dropout, Adam and a schedule: the fit
// that did not stop.
TEST(ShardedCheckpoint, ResumeMidEpochFromAFolderIsBitIdentical) {
  TempDir dir;
  auto train = shuffled_loader(36, 8);
  auto val = sequential_loader(8, 4);
  auto straight = stateful_model();
  torch::manual_seed(99);
  Trainer(resumable(dir, 3)).fit(*straight, train, val);

  const fs::path folder = dir.path / "mid.ckpt";
  auto stop = std::make_shared<Hooks>();
  stop->batch_end = [&](Trainer& t, int64_t) {
    if (t.current_epoch() != 1 || t.batches_in_epoch() != 3) return;
    t.save_checkpoint(folder.string());
    t.request_stop("test stop");
  };
  auto options = sharded(dir, 3);
  options.callbacks = {stop};
  auto first = stateful_model();
  torch::manual_seed(99);
  Trainer(options).fit(*first, train, val);
  ASSERT_TRUE(is_distributed_checkpoint(folder));
  EXPECT_TRUE(fs::is_regular_file(folder / "__0_0.distcp"));
  torch::manual_seed(12345);  // whatever the generators do in between

  auto resumed = stateful_model();
  Trainer more(sharded(dir, 3));
  more.fit(*resumed, train, val, {.ckpt_path = folder.string()});
  EXPECT_EQ(resumed->training_steps, 15 - 8);
  EXPECT_TRUE(same_parameters(*resumed, *straight));
}

// The folder in PyTorch's layout: the weights by Python's names, Adam's state
// in torch.optim's layout by the parameters' names (as get_state_dict and
// FSDP name them), the schedule's lr.
TEST(ShardedCheckpoint, FolderHoldsTheStateDictsInPyTorchsLayout) {
  TempDir dir;
  auto model = stateful_model();
  auto train = sequential_loader(16, 8);
  Trainer trainer(sharded(dir, 2));
  trainer.fit(*model, train);
  const fs::path folder = dir.path / "end.ckpt";
  trainer.save_checkpoint(folder.string());

  const auto state = read_distributed_checkpoint(folder).toGenericDict();
  const auto weights = state.at("model").toGenericDict();
  EXPECT_TRUE(torch::equal(weights.at("l1.weight").toTensor(), model->l1->weight));
  EXPECT_TRUE(torch::equal(weights.at("l2.bias").toTensor(), model->l2->bias));
  const auto adam = state.at("optimizer_0").toGenericDict();
  const auto first = adam.at("state").toGenericDict().at("l1.weight").toGenericDict();
  EXPECT_EQ(first.at("step").toTensor().item<float>(), 4.0f);
  EXPECT_EQ(first.at("exp_avg").toTensor().sizes(), model->l1->weight.sizes());
  const auto group = adam.at("param_groups").toList().get(0).toGenericDict();
  EXPECT_DOUBLE_EQ(group.at("lr").toDouble(), 0.01 * 0.7 * 0.7);
  std::vector<std::string> params;
  const c10::IValue saved_params = group.at("params");
  for (const c10::IValue& name : saved_params.toListRef()) params.push_back(name.toStringRef());
  EXPECT_EQ(params, (std::vector<std::string>{"l1.weight", "l1.bias", "l2.weight", "l2.bias"}));
  EXPECT_EQ(state.at("fulgor").toGenericDict().at("archive").toTensor().scalar_type(), torch::kUInt8);
}

// ModelCheckpoint's folders, saved in the foreground and in the background:
// the displaced one removed, "last" found.
TEST(ShardedCheckpoint, ModelCheckpointKeepsDisplacesAndFindsFolders) {
  for (const bool async : {false, true}) {
    TempDir dir;
    auto train = sequential_loader(16, 8);
    auto with_checkpoints = [&](int64_t epochs) {
      auto o = sharded(dir, epochs);
      o.callbacks = {std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions{.dirpath = (dir.path / "ckpt").string(), .filename = "{epoch}", .save_last = true})};
      o.enable_checkpointing = true;
      o.async_checkpointing = async;
      return o;
    };
    auto model = stateful_model();
    Trainer(with_checkpoints(3)).fit(*model, train);
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path / "ckpt")) {
      names.insert(e.path().filename().string());
      EXPECT_TRUE(is_distributed_checkpoint(e.path())) << e.path();
    }
    EXPECT_EQ(names, (std::set<std::string>{"epoch=2.ckpt", "last.ckpt"})) << "async " << async;
    // The last of several saves (in the background, each into the previous
    // one's memory) holds the weights the fit ended with.
    for (const char* folder : {"epoch=2.ckpt", "last.ckpt"}) {
      const auto weights = read_distributed_checkpoint(dir.path / "ckpt" / folder).toGenericDict().at("model");
      EXPECT_TRUE(torch::equal(weights.toGenericDict().at("l1.weight").toTensor(), model->l1->weight)) << folder;
    }

    auto resumed = stateful_model();
    Trainer trainer(with_checkpoints(5));
    trainer.fit(*resumed, train, {.ckpt_path = "last"});
    EXPECT_EQ(resumed->training_steps, 4) << "async " << async;
    EXPECT_EQ(trainer.global_step(), 10);
  }
}

// `optimizer_state` (torch.optim's, by numbers) by the parameters' `names`,
// as FSDP's optim_state_dict keys it.
c10::IValue by_names(const c10::IValue& optimizer_state, const std::vector<std::string>& names) {
  c10::impl::GenericDict dict = optimizer_state.toGenericDict().copy();
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : dict.at("state").toGenericDict()) state.insert(names.at(item.key().toInt()), item.value());
  dict.insert_or_assign("state", state);
  c10::impl::GenericList groups(c10::AnyType::get());
  const c10::IValue saved_groups = dict.at("param_groups");
  for (const c10::IValue& g : saved_groups.toListRef()) {
    c10::impl::GenericDict group = g.toGenericDict().copy();
    c10::impl::GenericList params(c10::AnyType::get());
    const c10::IValue ids = group.at("params");
    for (const c10::IValue& id : ids.toListRef()) params.push_back(names.at(id.toInt()));
    group.insert_or_assign("params", params);
    groups.push_back(group);
  }
  dict.insert_or_assign("param_groups", groups);
  return dict;
}

// Note [Optimizer states by parameter names]: a Lightning .ckpt whose
// optimizer state names the parameters (as its FSDP strategy writes it)
// resumes as the same .ckpt by torch.optim's numbers.
TEST(ShardedCheckpoint, ResumesALightningCheckpointWhoseOptimizerStateIsByNames) {
  TempDir dir;
  auto train = sequential_loader(16, 8);
  const fs::path fulgor_file = dir.path / "two.ckpt", numbered = dir.path / "numbered.ckpt",
                 named = dir.path / "named.ckpt";
  auto trained = stateful_model();
  Trainer trainer(resumable(dir, 2));
  trainer.fit(*trained, train);
  trainer.save_checkpoint(fulgor_file.string());
  export_lightning_checkpoint(*stateful_model(), fulgor_file, numbered);
  c10::impl::GenericDict checkpoint = torch_load(numbered).toGenericDict().copy();
  c10::impl::GenericList optimizers = checkpoint.at("optimizer_states").toList().copy();
  optimizers.set(0, by_names(optimizers.get(0), {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}));
  checkpoint.insert_or_assign("optimizer_states", optimizers);
  torch_save(checkpoint, named);

  std::vector<std::unique_ptr<TinyNet>> resumed;
  for (const fs::path& file : {numbered, named}) {
    resumed.push_back(stateful_model());
    torch::manual_seed(7);
    Trainer(resumable(dir, 3)).fit(*resumed.back(), train, {.ckpt_path = file.string()});
  }
  EXPECT_TRUE(same_parameters(*resumed[0], *resumed[1]));
  EXPECT_FALSE(same_parameters(*resumed[0], *trained)) << "the resumed fits trained";
}

bool says(const std::string& message, const std::string& part) { return message.find(part) != std::string::npos; }

TEST(ShardedCheckpoint, SaysWhatItCannotSave) {
  using test::thrown_message;
  TempDir dir;
  auto train = sequential_loader(16, 8);
  auto model = stateful_model();
  model->make_optimizers = [](TinyNet& m) -> OptimizerConfig {
    return std::make_shared<torch::optim::RMSprop>(m.parameters(), torch::optim::RMSpropOptions(0.01));
  };
  EXPECT_PRED2(
      says, thrown_message<ConfigError>([&] { Trainer(sharded(dir, 1)).fit(*model, train); }),
      std::string("state_dict_type=\"sharded\" saves the optimizers' states in torch.optim's layout, which "
                  "fulgor writes for SGD, Adam and AdamW; optimizer 0 from configure_optimizers is none of them"));
  auto options = resumable(dir, 1);
  options.state_dict_type = "partial";
  EXPECT_PRED2(says, thrown_message<ConfigError>([&] { Trainer(options).fit(*stateful_model(), train); }),
               std::string("state_dict_type='partial': expected \"full\""));
  // The optimizer's state by names: a name the resumed optimizer lacks.
  auto saved = stateful_model();
  Trainer saving(sharded(dir, 1));
  saving.fit(*saved, train);
  saving.save_checkpoint((dir.path / "all.ckpt").string());
  auto fewer = stateful_model();
  fewer->make_optimizers = [](TinyNet& m) -> OptimizerConfig {
    return std::make_shared<torch::optim::Adam>(m.l1->parameters(), torch::optim::AdamOptions(0.01));
  };
  EXPECT_PRED2(says, thrown_message<InteropError>([&] {
                 Trainer(sharded(dir, 2)).fit(*fewer, train, {.ckpt_path = (dir.path / "all.ckpt").string()});
               }),
               std::string("optimizer 0: the optimizer's state names parameter 'l2.weight', which is none of the "
                           "optimizer's 2 parameters"));
  // A distributed checkpoint that no fit wrote is no training checkpoint.
  DistributedStateDict weights = {{{std::string("model"), std::string("w")}, torch::ones({2}), std::nullopt}};
  const fs::path folder = dir.path / "weights.dcp";
  save_distributed_checkpoint(weights, folder);
  EXPECT_PRED2(says, thrown_message<CheckpointError>([&] {
                 Trainer(resumable(dir, 1)).fit(*stateful_model(), train, {.ckpt_path = folder.string()});
               }),
               std::string("is a distributed checkpoint without fulgor's state"));
}

}  // namespace
}  // namespace fulgor::testing
