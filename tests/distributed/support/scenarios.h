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

/// The sync_batchnorm scenario: kSyncBnRows samples that rank 0 (the first
/// kSyncBnShard0) and rank 1 (the rest) normalize together, in two layers: a
/// BatchNorm1d over (N, 3, 5) in float64 with momentum 0.3, and a BatchNorm2d
/// over (N, 2, 3, 3) in float32 with a cumulative average (no momentum). Each
/// starts from a state of its own (not BatchNorm's initial one).
constexpr int64_t kSyncBnRows = 8, kSyncBnShard0 = 5;
struct SyncBnCase {
  torch::nn::Sequential layer;
  torch::Tensor x;         // all kSyncBnRows samples
  torch::Tensor upstream;  // the loss is (layer(x) * upstream).sum()
};
inline SyncBnCase make_sync_bn_case(bool spatial) {
  torch::Generator g = at::detail::createCPUGenerator(spatial ? 23 : 19);
  const auto type = spatial ? torch::kFloat32 : torch::kFloat64;
  const int64_t channels = spatial ? 2 : 3;
  SyncBnCase c;
  if (spatial) {
    c.layer = torch::nn::Sequential(torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(2).momentum(c10::nullopt)));
    c.x = torch::randn({kSyncBnRows, 2, 3, 3}, g).to(type) * 3 + 1;
  } else {
    c.layer = torch::nn::Sequential(torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(3).momentum(0.3)));
    c.x = torch::randn({kSyncBnRows, 3, 5}, g).to(type) * 2 - 1;
  }
  c.upstream = torch::randn(c.x.sizes(), g).to(type);
  c.layer->to(type);
  torch::NoGradGuard no_grad;
  for (auto& p : c.layer->parameters()) p.copy_(torch::randn({channels}, g));
  auto buffers = c.layer->named_buffers();
  buffers["0.running_mean"].copy_(torch::randn({channels}, g));
  buffers["0.running_var"].copy_(torch::rand({channels}, g) + 0.5);
  buffers["0.num_batches_tracked"].fill_(4);
  return c;
}

}  // namespace fulgor::test
