#pragma once

// The model and data the distributed workers train on, shared with the tests
// that recompute the expected results in one process.

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fulgor::test {

constexpr int64_t kGlobalBatch = 32;
constexpr int64_t kFeatures = 4;

inline torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(kFeatures, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1));
}

/// `steps` global batches of kGlobalBatch samples: inputs and targets.
inline std::pair<torch::Tensor, torch::Tensor> make_data(int64_t steps) {
  torch::Generator generator = at::detail::createCPUGenerator(7);
  torch::Tensor x = torch::randn({steps * kGlobalBatch, kFeatures}, generator);
  torch::Tensor y = torch::randn({steps * kGlobalBatch, 1}, generator);
  return {x, y};
}

/// The tensors `names` that a worker saved to `path` with an OutputArchive.
inline std::map<std::string, torch::Tensor> load_tensors(const std::string& path,
                                                         const std::vector<std::string>& names) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  std::map<std::string, torch::Tensor> result;
  for (const std::string& name : names) archive.read(name, result[name]);
  return result;
}

/// The seed rank `rank` initialises its model with: different on every rank,
/// so the tests see the initial broadcast take effect.
inline uint64_t init_seed(int64_t rank) { return 100 + static_cast<uint64_t>(rank); }

constexpr double kLearningRate = 0.1;

/// What the metrics scenario evaluates: kMetricSamples samples of three-class
/// scores and labels, binary scores and labels, and regression pairs. Rank 0
/// takes the first kMetricShard0 samples and rank 1 the rest (unequal shards),
/// each in batches of kMetricBatch with a shorter last one.
constexpr int64_t kMetricSamples = 11, kMetricShard0 = 7, kMetricBatch = 3;
struct MetricData {
  torch::Tensor scores, labels, probs, binary, preds, target;
};
inline MetricData make_metric_data() {
  torch::Generator g = at::detail::createCPUGenerator(11);
  MetricData d;
  d.scores = torch::randn({kMetricSamples, 3}, g);
  d.labels = torch::randint(0, 3, {kMetricSamples}, g);
  d.probs = torch::rand({kMetricSamples}, g);
  d.binary = torch::randint(0, 2, {kMetricSamples}, g);
  d.preds = torch::randn({kMetricSamples}, g);
  d.target = torch::randn({kMetricSamples}, g);
  return d;
}

}  // namespace fulgor::test
