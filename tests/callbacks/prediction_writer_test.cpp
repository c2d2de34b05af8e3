// BasePredictionWriter and TorchSavePredictionWriter, as Lightning's
// BasePredictionWriter; the .pt files read back by python3-torch.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "../support/tiny.h"
#include "fulgor/fulgor.h"

namespace fulgor::testing {
namespace {

using Json = nlohmann::json;

// Predictions that differ by sample, and the rows each step was given.
struct Predictor : TinyNet {
  std::vector<torch::Tensor> inputs;
  torch::Tensor predict_step(torch::data::Example<> batch, int64_t i) override {
    inputs.push_back(batch.data);
    return TinyNet::predict_step(batch, i);
  }
};

// 10 samples in random order (a sampler of the test's, which the Trainer
// leaves as it is), in batches of 4, 4 and 2.
TensorLoader shuffled_predict_loader(const XY& data) {
  torch::manual_seed(3);
  return TensorLoader(data.x, data.y, std::make_unique<torch::data::samplers::RandomSampler>(10), {.batch_size = 4});
}

Json tensor_value(const torch::Tensor& t) {
  auto flat = t.to(torch::kDouble).contiguous();
  if (t.dim() == 0) return flat.item<double>();
  Json rows = Json::array();
  for (int64_t r = 0; r < t.size(0); ++r) rows.push_back(tensor_value(flat[r]));
  return rows;
}

// The indices of each batch, found from its rows in the data set.
std::vector<std::vector<int64_t>> rows_in(const XY& data, const std::vector<torch::Tensor>& inputs) {
  std::vector<std::vector<int64_t>> batches;
  for (const auto& batch : inputs) {
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < batch.size(0); ++r)
      for (int64_t k = 0; k < data.x.size(0); ++k)
        if (torch::equal(data.x[k], batch[r])) rows.push_back(k);
    EXPECT_EQ(static_cast<int64_t>(rows.size()), batch.size(0));
    batches.push_back(rows);
  }
  return batches;
}

// Runs prediction_files_check.py on `dir` with `expected`; its output on failure.
void expect_python_reads(const std::filesystem::path& dir, const Json& expected) {
  const auto path = dir.parent_path() / "expected.json";
  std::ofstream(path) << expected.dump();
  const auto log = dir.parent_path() / "check.log";
  const std::string command = std::string(FULGOR_PYTHON_TORCH) + " -W ignore " + FULGOR_PREDICTION_FILES_CHECK + " " +
                              path.string() + " " + dir.string() + " > " + log.string() + " 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(status, 0) << command << "\n" << output;
}

struct WrittenRun {
  std::vector<torch::Tensor> predictions;
  std::vector<std::vector<int64_t>> indices;
};

WrittenRun predict_with(const TempDir& dir, const std::string& folder, const std::string& interval, bool shuffled) {
  XY data(10, 5);
  Predictor model;
  auto writer = std::make_shared<TorchSavePredictionWriter>(dir.path / folder, interval);
  Trainer trainer(quiet(dir, 1, {writer}));
  WrittenRun run;
  if (shuffled) {
    auto loader = shuffled_predict_loader(data);
    run.predictions = trainer.predict(model, loader);
    run.indices = rows_in(data, model.inputs);
  } else {
    auto loader = sequential_loader(10, 4, 5);
    run.predictions = trainer.predict(model, loader);
  }
  return run;
}

Json batch_files(const WrittenRun& run, bool with_indices) {
  Json expected = Json::object();
  for (size_t i = 0; i < run.predictions.size(); ++i) {
    const auto stem = "0_" + std::to_string(i) + ".pt";
    expected["predictions_" + stem] = {{"kind", "tensor"}, {"value", tensor_value(run.predictions[i])}};
    if (with_indices) expected["batch_indices_" + stem] = {{"kind", "ints"}, {"value", run.indices[i]}};
  }
  return expected;
}

Json epoch_files(const WrittenRun& run, bool with_indices) {
  Json values = Json::array();
  for (const auto& p : run.predictions) values.push_back(tensor_value(p));
  Json expected = {{"predictions_0.pt", {{"kind", "tensors"}, {"value", values}}}};
  if (with_indices) expected["batch_indices_0.pt"] = {{"kind", "int_lists"}, {"value", run.indices}};
  return expected;
}

// Each interval, with the indices of a sampled loader and without those of
// a loader that does not tell them; python3-torch reads all the files at once.
TEST(PredictionWriter, WritesFilesTorchLoadsForEachInterval) {
  TempDir dir;
  auto prefixed = [](const std::string& folder, const Json& files) {
    Json out = Json::object();
    for (const auto& [name, entry] : files.items()) out[folder + "/" + name] = entry;
    return out;
  };
  Json expected = Json::object();
  auto batch = predict_with(dir, "out/batch", "batch", true);
  ASSERT_EQ(batch.predictions.size(), 3u);
  // The sampler's order, not the data set's.
  EXPECT_NE(batch.indices[0], (std::vector<int64_t>{0, 1, 2, 3}));
  expected.update(prefixed("batch", batch_files(batch, true)));
  expected.update(prefixed("epoch", epoch_files(predict_with(dir, "out/epoch", "epoch", true), true)));
  auto both = predict_with(dir, "out/both", "batch_and_epoch", true);
  expected.update(prefixed("both", batch_files(both, true)));
  expected.update(prefixed("both", epoch_files(both, true)));
  auto unindexed = predict_with(dir, "out/unindexed", "batch_and_epoch", false);
  expected.update(prefixed("unindexed", batch_files(unindexed, false)));
  expected.update(prefixed("unindexed", epoch_files(unindexed, false)));
  expect_python_reads(dir.path / "out", expected);
}

// A writer of its own: what the hooks hand it, and Lightning's refusals.
struct CollectingWriter : BasePredictionWriter {
  using BasePredictionWriter::BasePredictionWriter;
  std::vector<int64_t> batch_idx;
  std::vector<std::vector<int64_t>> batch_indices;
  size_t epoch_predictions = 0;
  void write_on_batch_end(Trainer&, ModuleBase&, const torch::Tensor& prediction, const std::vector<int64_t>& indices,
                          const BatchEnd& end) override {
    EXPECT_TRUE(prediction.is_same(end.outputs));
    batch_idx.push_back(end.batch_idx);
    batch_indices.push_back(indices);
  }
};

TEST(PredictionWriter, ABatchWriterSeesEachBatchAndNeedsNoEpochWriter) {
  TempDir dir;
  XY data(10, 5);
  Predictor model;
  auto writer = std::make_shared<CollectingWriter>("batch");
  Trainer trainer(quiet(dir, 1, {writer}));
  auto loader = shuffled_predict_loader(data);
  trainer.predict(model, loader);
  EXPECT_EQ(writer->batch_idx, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(writer->batch_indices, rows_in(data, model.inputs));
}

TEST(PredictionWriter, RefusesAnUnknownIntervalAndAMissingWriter) {
  try {
    CollectingWriter("step");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("['batch', 'epoch', 'batch_and_epoch'], not 'step'"), std::string::npos)
        << e.what();
  }
  TempDir dir;
  Predictor model;
  Trainer trainer(quiet(dir, 1, {std::make_shared<CollectingWriter>("epoch")}));
  auto loader = sequential_loader(4, 2);
  EXPECT_THROW(trainer.predict(model, loader), Error);
}

}  // namespace
}  // namespace fulgor::testing
