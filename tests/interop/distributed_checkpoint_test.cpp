// Distributed checkpoints in one process: flattening as Python's DCP does,
// saving and reading back, pieces loaded into other cuts, atomic
// replacement, killed saves' temporaries removed, and folders from elsewhere
// refused
// (Note [A distributed checkpoint from elsewhere]).

#include <fmt/format.h>
#include <fulgor/core/error.h>
#include <fulgor/interop/distributed_checkpoint.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "interop_support.h"
#include "../support/thrown.h"

namespace fulgor::interop_test {
namespace {

c10::impl::GenericDict dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// The shape of a Python {model, optim, extra} state: an optimizer's state
// keyed by ints, its param_groups a list of dicts, plain lists kept whole.
c10::IValue sample_state() {
  torch::manual_seed(3);
  auto model = dict();
  model.insert("net.0.weight", torch::randn({5, 3}, torch::kFloat64));
  model.insert("net.0.bias", torch::randn({5}, torch::kFloat32));
  auto moments = dict();
  moments.insert("step", torch::tensor(3.0));
  moments.insert("exp_avg", torch::randn({5, 3}, torch::kFloat64));
  auto state = c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get());
  state.insert(int64_t{0}, moments);
  auto group = dict();
  group.insert("lr", 0.01);
  group.insert("betas", c10::ivalue::Tuple::create(0.9, 0.999));
  group.insert("params", c10::List<int64_t>({0, 1}));
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(group);
  auto optim = dict();
  optim.insert("state", state);
  optim.insert("param_groups", groups);
  auto extra = dict();
  extra.insert("epoch", int64_t{3});
  extra.insert("name", std::string("run"));
  extra.insert("lrs", c10::List<double>({0.1, 0.01}));
  auto root = dict();
  root.insert("model", model);
  root.insert("optim", optim);
  root.insert("extra", extra);
  return root;
}

const c10::IValue& at(const c10::IValue& nested, const std::vector<std::string>& keys) {
  const c10::IValue* value = &nested;
  for (const auto& key : keys) {
    if (value->isList()) {
      value = &value->toListRef()[std::stoul(key)];
      continue;
    }
    auto dict = value->toGenericDict();
    auto found = dict.find(key);
    if (found == dict.end()) throw std::runtime_error("no " + key);
    value = &found->value();
  }
  return *value;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const fs::path& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

// The .metadata with `from` replaced by `to` (same length: the pickle's
// string lengths stay right).
void patch_metadata(const fs::path& folder, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string data = read_all(folder / ".metadata");
  auto at = data.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  data.replace(at, from.size(), to);
  write_all(folder / ".metadata", data);
}

std::string load_error(const fs::path& folder) {
  try {
    read_distributed_checkpoint(folder);
  } catch (const InteropError& e) {
    return e.what();
  }
  return "no error";
}

TEST(DistributedCheckpoint, FlattensNestedStatesAsPythonDoes) {
  DistributedStateDict flat = flatten_state_dict(sample_state());
  std::vector<std::string> names;
  for (const auto& entry : flat) names.push_back(entry.fqn());
  EXPECT_EQ(names, (std::vector<std::string>{"model.net.0.weight", "model.net.0.bias", "optim.state.0.step",
                                             "optim.state.0.exp_avg", "optim.param_groups.0.lr",
                                             "optim.param_groups.0.betas", "optim.param_groups.0.params",
                                             "extra.epoch", "extra.name", "extra.lrs"}));
  // Dict keys become strings, list indices stay ints (planner_data's paths).
  EXPECT_TRUE(flat[2].path[2].isString());
  EXPECT_TRUE(flat[4].path[2].isInt());
  EXPECT_THROW(flatten_state_dict(torch::zeros({1})), InteropError);
}

TEST(DistributedCheckpoint, SavesAndReadsBackEveryValue) {
  ScratchDir dir("dcp_round_trip");
  c10::IValue state = sample_state();
  save_distributed_checkpoint(flatten_state_dict(state), dir.path() / "ckpt");
  EXPECT_TRUE(is_distributed_checkpoint(dir.path() / "ckpt"));
  EXPECT_TRUE(fs::exists(dir.path() / "ckpt" / "__0_0.distcp"));
  c10::IValue back = read_distributed_checkpoint(dir.path() / "ckpt");
  EXPECT_TRUE(torch::equal(at(back, {"model", "net.0.weight"}).toTensor(),
                           at(state, {"model", "net.0.weight"}).toTensor()));
  EXPECT_EQ(at(back, {"model", "net.0.bias"}).toTensor().scalar_type(), torch::kFloat32);
  c10::IValue moments = at(state, {"optim", "state"}).toGenericDict().at(int64_t{0});
  EXPECT_TRUE(torch::equal(at(back, {"optim", "state", "0", "exp_avg"}).toTensor(),
                           moments.toGenericDict().at("exp_avg").toTensor()))
      << "the int key 0 comes back as the string '0', as in Python's DCP";
  EXPECT_DOUBLE_EQ(at(back, {"optim", "param_groups", "0", "lr"}).toDouble(), 0.01);
  EXPECT_EQ(at(back, {"optim", "param_groups", "0", "params"}).toListRef().size(), 2u);
  EXPECT_EQ(at(back, {"extra", "name"}).toStringRef(), "run");
  EXPECT_EQ(at(back, {"extra", "epoch"}).toInt(), 3);
}

// One tensor saved as two pieces, loaded into other cuts.
TEST(DistributedCheckpoint, PiecesLoadIntoAnyOtherCut) {
  ScratchDir dir("dcp_pieces");
  torch::Tensor whole = torch::arange(15, torch::kFloat64).reshape({5, 3});
  auto piece = [&](int64_t begin, int64_t length) {
    return DistributedCheckpointEntry{{std::string("w")}, whole.narrow(0, begin, length),
                                      TensorPlacement{{begin, 0}, {5, 3}}};
  };
  save_distributed_checkpoint({piece(0, 2), piece(2, 3)}, dir.path() / "ckpt");
  DistributedStateDict cuts{{{std::string("w")}, torch::zeros({3, 3}, torch::kFloat64), TensorPlacement{{0, 0}, {5, 3}}},
                            {{std::string("w")}, torch::zeros({2, 3}, torch::kFloat64), TensorPlacement{{3, 0}, {5, 3}}},
                            {{std::string("w")}, torch::zeros({5, 2}, torch::kFloat64), TensorPlacement{{0, 1}, {5, 3}}},
                            {{std::string("w")}, torch::zeros({5, 3}, torch::kFloat64), std::nullopt}};
  load_distributed_checkpoint(cuts, dir.path() / "ckpt");
  EXPECT_TRUE(torch::equal(cuts[0].value.toTensor(), whole.narrow(0, 0, 3)));
  EXPECT_TRUE(torch::equal(cuts[1].value.toTensor(), whole.narrow(0, 3, 2)));
  EXPECT_TRUE(torch::equal(cuts[2].value.toTensor(), whole.narrow(1, 1, 2)));
  EXPECT_TRUE(torch::equal(cuts[3].value.toTensor(), whole));
}

TEST(DistributedCheckpoint, RefusesPiecesThatOverlapOrLeaveAGap) {
  ScratchDir dir("dcp_bad_pieces");
  torch::Tensor rows = torch::zeros({3, 3});
  auto piece = [&](int64_t begin) {
    return DistributedCheckpointEntry{{std::string("w")}, rows, TensorPlacement{{begin, 0}, {5, 3}}};
  };
  std::string overlap = test::thrown_message<InteropError>([&] { save_distributed_checkpoint({piece(0), piece(2)}, dir.path() / "a"); });
  EXPECT_NE(overlap.find("'w' has overlapping chunks at (0, 0) and (2, 0)"), std::string::npos) << overlap;
  std::string gap = test::thrown_message<InteropError>([&] { save_distributed_checkpoint({piece(0)}, dir.path() / "b"); });
  EXPECT_NE(gap.find("'w' is covered by its chunks in 9 of its 15 elements"), std::string::npos) << gap;
  EXPECT_FALSE(fs::exists(dir.path() / "a"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), {}), 0) << "nothing written";
}

TEST(DistributedCheckpoint, ReplacesAnOlderCheckpointWholeAndKeepsItWhenTheSaveFails) {
  ScratchDir dir("dcp_replace");
  auto state = [](double value) {
    return DistributedStateDict{{{std::string("w")}, torch::full({4}, value), std::nullopt}};
  };
  save_distributed_checkpoint(state(1), dir.path() / "ckpt");
  save_distributed_checkpoint(state(2), dir.path() / "ckpt");
  EXPECT_TRUE(torch::equal(read_distributed_checkpoint(dir.path() / "ckpt").toGenericDict().at("w").toTensor(),
                           torch::full({4}, 2.0)));
  DistributedStateDict unwritable = state(3);
  unwritable.push_back({{std::string("q")}, torch::empty({2}, torch::TensorOptions().device(torch::kMeta)), std::nullopt});
  EXPECT_THROW(save_distributed_checkpoint(unwritable, dir.path() / "ckpt"), InteropError);
  EXPECT_TRUE(torch::equal(read_distributed_checkpoint(dir.path() / "ckpt").toGenericDict().at("w").toTensor(),
                           torch::full({4}, 2.0)));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), {}), 1) << "no temporary folder left";
  fs::create_directories(dir.path() / "mine");
  write_all(dir.path() / "mine" / "notes.txt", "keep");
  std::string refused = test::thrown_message<InteropError>([&] { save_distributed_checkpoint(state(4), dir.path() / "mine"); });
  EXPECT_NE(refused.find("exists and is not a distributed checkpoint"), std::string::npos) << refused;
  EXPECT_EQ(read_all(dir.path() / "mine" / "notes.txt"), "keep");
}

// Note [Temporary checkpoint folders]: a save removes the folders that killed
// saves of its checkpoint left beside it, and not one a running save holds.
TEST(DistributedCheckpoint, RemovesTheTemporaryFoldersOfKilledSavesButNotOfRunningOnes) {
  ScratchDir dir("dcp_partials");
  auto state = [](double value) {
    return DistributedStateDict{{{std::string("w")}, torch::full({4}, value), std::nullopt}};
  };
  const fs::path killed = dir.path() / ".ckpt.partial4242-17", running = dir.path() / ".ckpt.partial4243-18",
                 other = dir.path() / ".other.partial4244-19";
  for (const fs::path& folder : {killed, running, other}) {
    fs::create_directories(folder);
    write_all(folder / "__0_0.distcp", std::string(1024, 'x'));
  }
  const int held = ::open(running.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  save_distributed_checkpoint(state(1), dir.path() / "ckpt");
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_TRUE(fs::exists(running / "__0_0.distcp"));
  EXPECT_TRUE(fs::exists(other / "__0_0.distcp")) << "another checkpoint's temporaries are for its own saves";
  ::close(held);
  save_distributed_checkpoint(state(2), dir.path() / "ckpt");
  EXPECT_FALSE(fs::exists(running)) << "removed once no save holds it";
  EXPECT_TRUE(torch::equal(read_distributed_checkpoint(dir.path() / "ckpt").toGenericDict().at("w").toTensor(),
                           torch::full({4}, 2.0)));
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir.path())) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{".other.partial4244-19", "ckpt"}));
}

TEST(DistributedCheckpoint, RefusesFoldersThatPointOutsideOrEndEarly) {
  ScratchDir dir("dcp_hostile");
  auto fresh = [&](const std::string& name) {
    fs::path folder = dir.path() / name;
    save_distributed_checkpoint({{{std::string("w")}, torch::arange(6.0), std::nullopt}}, folder);
    return folder;
  };
  fs::path outside = fresh("outside");
  patch_metadata(outside, "__0_0.distcp", "../0_0.distc");
  EXPECT_NE(load_error(outside).find("is stored in '../0_0.distc', which is not a file directly in the checkpoint's"),
            std::string::npos)
      << load_error(outside);

  fs::path truncated = fresh("truncated");
  fs::resize_file(truncated / "__0_0.distcp", 100);
  EXPECT_NE(load_error(truncated).find("past the end of its file of 100 bytes"), std::string::npos)
      << load_error(truncated);

  fs::path linked = fresh("linked");
  fs::rename(linked / "__0_0.distcp", dir.path() / "elsewhere.distcp");
  fs::create_symlink(dir.path() / "elsewhere.distcp", linked / "__0_0.distcp");
  EXPECT_NE(load_error(linked).find("is a link"), std::string::npos) << load_error(linked);

  fs::path foreign = fresh("foreign");
  patch_metadata(foreign, "_StorageInfo", "_StorageInfX");
  EXPECT_NE(load_error(foreign).find("names the global 'torch.distributed.checkpoint.filesystem._StorageInfX', which "
                                     "fulgor refuses to load"),
            std::string::npos)
      << load_error(foreign);

  DistributedStateDict wrong{{{std::string("w")}, torch::zeros({6}, torch::kFloat64), std::nullopt}};
  std::string mismatch = test::thrown_message<InteropError>([&] { load_distributed_checkpoint(wrong, fresh("dtype")); });
  EXPECT_NE(mismatch.find("holds 'w' as a Float tensor of (6), not a Double tensor of (6)"), std::string::npos)
      << mismatch;
  DistributedStateDict missing{{{std::string("v")}, torch::zeros({6}), std::nullopt}};
  std::string absent = test::thrown_message<InteropError>([&] { load_distributed_checkpoint(missing, fresh("absent")); });
  EXPECT_NE(absent.find("has no 'v'"), std::string::npos) << absent;
}

// The paths of a folder nest its values again only where they nest: a key
// that is both a value and a container, or a list index beyond the state's
// values, is an error, not a crash or a list of a billion Nones.
TEST(DistributedCheckpoint, RefusesPathsThatDoNotNest) {
  ScratchDir dir("dcp_paths");
  auto entry = [](std::vector<c10::IValue> path) {
    return DistributedCheckpointEntry{std::move(path), torch::ones({1}), std::nullopt};
  };
  save_distributed_checkpoint({entry({std::string("a"), int64_t{0}}), entry({std::string("a"), std::string("b")})},
                              dir.path() / "crossed");
  EXPECT_NE(load_error(dir.path() / "crossed").find("the path of 'a.b' runs through a value of another key"),
            std::string::npos)
      << load_error(dir.path() / "crossed");
  save_distributed_checkpoint({entry({std::string("a"), int64_t{1000000000}})}, dir.path() / "far");
  EXPECT_NE(load_error(dir.path() / "far").find("has the list index 1000000000, outside the 1 values of the state"),
            std::string::npos)
      << load_error(dir.path() / "far");
  EXPECT_THROW(unflatten_state_dict({entry({std::string("a")}), entry({std::string("a"), std::string("b")})}),
               InteropError);
}

}  // namespace
}  // namespace fulgor::interop_test
