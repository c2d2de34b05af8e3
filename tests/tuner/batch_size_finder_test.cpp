// The batch-size search against Lightning 2.6.5's: batch_size_finder_reference.py
// runs Lightning's search functions against the same memory limit, and the
// sizes tried must be the same, in the same order; and the fit around a
// search goes on bit for bit as one started at the size found.

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../support/python_reference.h"
#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

// A module whose steps run out of memory above a batch size, as a device
// would: LibTorch's OutOfMemoryError, which the CPU accelerator recognises.
// Its loader reads the size from hparams()["batch_size"].
struct MemoryBoundNet : TinyNet {
  int64_t limit;
  torch::Tensor x, y;
  MemoryBoundNet(int64_t largest_fitting, int64_t samples, int64_t batch_size = 16) : limit(largest_fitting) {
    XY data(samples, 9);
    x = data.x;
    y = data.y;
    save_hyperparameters({{"batch_size", batch_size}});
  }
  AnyLoader<> train_loader() override {
    return TensorLoader(x, y, {.batch_size = hparams().at("batch_size").get<int64_t>()});
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    TORCH_CHECK_WITH(OutOfMemoryError, batch.data.size(0) <= limit, "out of memory: a batch of ", batch.data.size(0));
    return TinyNet::training_step(std::move(batch), batch_idx);
  }
};

TEST(BatchSizeFinder, SearchesAsLightning) {
  struct Case {
    ScaleBatchSizeOptions options;
    int64_t limit, samples;
  };
  const std::vector<Case> cases = {
      {{.mode = "power"}, 100, 1024},
      {{.mode = "binsearch", .margin = 0.0}, 100, 1024},
      {{.mode = "binsearch"}, 100, 1024},  // the 5% margin
      {{.mode = "power"}, 1, 64},          // the first size fails
      {{.mode = "binsearch", .init_val = 3, .margin = 0.0}, 37, 512},
      {{.mode = "power", .max_trials = 3}, 1000, 1024},  // trials run out
      {{.mode = "binsearch", .max_trials = 4, .margin = 0.0}, 50, 1024},
      {{.mode = "power", .max_val = 32}, 1000, 1024},    // the cap
      {{.mode = "power", .init_val = 64}, 100000, 256},  // the data set's length
      {{.mode = "binsearch", .init_val = 64, .margin = 0.0}, 100000, 200},
  };
  nlohmann::json request = {{"cases", nlohmann::json::array()}};
  std::vector<std::vector<BatchSizeTrial>> trials;
  std::vector<int64_t> found, attribute;
  for (const auto& c : cases) {
    TempDir dir;
    torch::manual_seed(1);
    MemoryBoundNet net(c.limit, c.samples);
    Trainer trainer(quiet(dir, 1));
    auto finder = std::make_shared<BatchSizeFinder>(c.options);
    const auto size = Tuner(trainer).scale_batch_size(net, c.options);
    ASSERT_TRUE(size.has_value());
    found.push_back(*size);
    attribute.push_back(net.hparams().at("batch_size").get<int64_t>());
    const auto& o = c.options;
    request["cases"].push_back({{"mode", o.mode},
                                {"init_val", o.init_val},
                                {"max_trials", o.max_trials},
                                {"margin", o.margin},
                                {"max_val", o.max_val},
                                {"limit", c.limit},
                                {"start", 16},
                                {"dataset_length", c.samples}});
    // The trials, recorded by a second search through the callback itself.
    TempDir again;
    MemoryBoundNet net2(c.limit, c.samples);
    Trainer with_callback(quiet(again, 1, {finder}));
    with_callback.fit(net2);
    trials.push_back(finder->trials());
    EXPECT_EQ(finder->optimal_batch_size(), size);
  }
  const std::string input = ::testing::TempDir() + "fulgor_bsf_in_" + std::to_string(::getpid()) + ".json";
  std::ofstream(input) << request.dump();
  const auto reference = test::python_reference(
      FULGOR_PYTHON_TORCH, std::string(FULGOR_BATCH_SIZE_FINDER_REFERENCE) + " " + input, "batch_size_finder");
  std::remove(input.c_str());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const auto& expected = reference["cases"][i];
    std::vector<BatchSizeTrial> expected_trials;
    for (const auto& t : expected["trials"]) expected_trials.push_back({t[0].get<int64_t>(), t[1].get<bool>()});
    EXPECT_EQ(trials[i], expected_trials);
    EXPECT_EQ(found[i], expected["found"].get<int64_t>());
    EXPECT_EQ(attribute[i], expected["attribute"].get<int64_t>());
  }
  // What the limits make of it: the largest power of two, and the limit itself.
  EXPECT_EQ(found[0], 64);
  EXPECT_EQ(found[1], 100);
  EXPECT_EQ(found[2], 95);
}

// A data module holding the batch size, as Lightning's datamodule.batch_size.
struct SizedData : DataModule {
  torch::Tensor x, y;
  SizedData() {
    XY data(512, 3);
    x = data.x;
    y = data.y;
    save_hyperparameters({{"batch_size", 8}});
  }
  AnyLoader<> train_loader() override {
    return TensorLoader(x, y, {.batch_size = hparams().at("batch_size").get<int64_t>(), .shuffle = true});
  }
};

struct BoundNet : TinyNet {
  using TinyNet::TinyNet;
  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    TORCH_CHECK_WITH(OutOfMemoryError, batch.data.size(0) <= 40, "out of memory");
    return TinyNet::training_step(std::move(batch), batch_idx);
  }
};

std::vector<torch::Tensor> fitted_weights(int64_t batch_size, std::shared_ptr<BatchSizeFinder> finder) {
  TempDir dir;
  torch::manual_seed(21);
  BoundNet net(0.3);
  SizedData data;
  if (!finder) data.save_hyperparameters({{"batch_size", batch_size}});
  Trainer trainer(quiet(
      dir, 2, finder ? std::vector<std::shared_ptr<Callback>>{finder} : std::vector<std::shared_ptr<Callback>>{}));
  trainer.fit(net, data);
  EXPECT_EQ(data.hparams().at("batch_size").get<int64_t>(), batch_size);
  EXPECT_EQ(trainer.global_step(), 2 * ((512 + batch_size - 1) / batch_size));
  std::vector<torch::Tensor> weights;
  for (const auto& p : net.parameters()) weights.push_back(p.detach().clone());
  return weights;
}

TEST(BatchSizeFinder, FitGoesOnAtTheSizeFoundBitForBit) {
  auto finder = std::make_shared<BatchSizeFinder>(ScaleBatchSizeOptions{.mode = "binsearch", .margin = 0.0});
  const auto searched = fitted_weights(40, finder);
  EXPECT_EQ(finder->optimal_batch_size(), 40);
  const auto plain = fitted_weights(40, nullptr);
  ASSERT_EQ(searched.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(searched[i], plain[i]));
}

TEST(BatchSizeFinder, RefusesWhatItCannotSearch) {
  EXPECT_THROW(BatchSizeFinder({.mode = "linear"}), ConfigError);
  EXPECT_NO_THROW(BatchSizeFinder({.mode = "BinSearch"}));
  EXPECT_THROW(BatchSizeFinder({.margin = 1.0}), ConfigError);
  EXPECT_THROW(BatchSizeFinder({.steps_per_trial = 0}), ConfigError);

  TempDir dir;
  MemoryBoundNet net(100, 256);
  auto loader = shuffled_loader(64, 8);
  Trainer given_loader(quiet(dir, 1, {std::make_shared<BatchSizeFinder>()}));
  EXPECT_THROW(given_loader.fit(net, loader), ConfigError);

  MemoryBoundNet unnamed(100, 256);
  unnamed.save_hyperparameters({{"bs", 16}});
  Trainer trainer(quiet(dir, 1));
  try {
    Tuner(trainer).scale_batch_size(unnamed);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("batch_arg_name=\"batch_size\""), std::string::npos) << e.what();
  }
  Trainer with_finder(quiet(dir, 1, {std::make_shared<BatchSizeFinder>()}));
  EXPECT_THROW(Tuner(with_finder).scale_batch_size(net), ConfigError);

  auto debug_options = quiet(dir, 1);
  debug_options.fast_dev_run = 1;
  Trainer debug(debug_options);
  EXPECT_EQ(Tuner(debug).scale_batch_size(net), std::nullopt);
  EXPECT_EQ(net.hparams().at("batch_size").get<int64_t>(), 16);
}

// An error that is not about memory ends the search, after the weights are put back.
struct FailingNet : MemoryBoundNet {
  using MemoryBoundNet::MemoryBoundNet;
  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    if (batch.data.size(0) > 8) throw std::runtime_error("not a memory problem");
    return MemoryBoundNet::training_step(std::move(batch), batch_idx);
  }
};

TEST(BatchSizeFinder, OtherErrorsEndTheSearch) {
  TempDir dir;
  torch::manual_seed(2);
  FailingNet net(100, 256);
  std::vector<torch::Tensor> before;
  for (const auto& p : net.parameters()) before.push_back(p.detach().clone());
  Trainer trainer(quiet(dir, 1));
  EXPECT_THROW(Tuner(trainer).scale_batch_size(net), std::runtime_error);
  const auto params = net.parameters();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(params[i], before[i]));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

TEST(BatchSizeFinder, CpuAcceleratorRecognisesOutOfMemory) {
  const auto cpu = make_accelerator("cpu");
  try {
    (void)torch::empty({int64_t{1} << 56}, torch::kByte);
    ADD_FAILURE() << "a 64 PiB tensor was allocated";
  } catch (const std::exception& e) {
    EXPECT_TRUE(cpu->is_out_of_memory(e)) << e.what();
  }
  try {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "a device is full");
  } catch (const std::exception& e) {
    EXPECT_TRUE(cpu->is_out_of_memory(e));
  }
  EXPECT_FALSE(cpu->is_out_of_memory(std::runtime_error("out of patience")));
  try {
    TORCH_CHECK(false, "shape mismatch");
  } catch (const std::exception& e) {
    EXPECT_FALSE(cpu->is_out_of_memory(e));
  }
}

}  // namespace
}  // namespace fulgor::testing
