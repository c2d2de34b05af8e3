// fulgor::metrics over two ranks with unequal shards, through gloo: the
// values over both ranks equal the references over all the samples in one
// process (counts summed, not the mean of the ranks' values).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>
#include <set>

#include "support/scenarios.h"
#include "support/spawn.h"

namespace {

using fulgor::test::kMetricSamples;
using fulgor::test::kMetricShard0;

std::vector<double> doubles(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kDouble).contiguous().reshape({-1});
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// References over samples [begin, end), as scikit-learn defines them.
struct Reference {
  double accuracy = 0, f1 = 0, auroc = 0, mse = 0, mean = 0;
};

Reference reference(const fulgor::test::MetricData& d, int64_t begin, int64_t end) {
  const auto labels = doubles(d.labels), probs = doubles(d.probs), binary = doubles(d.binary), preds = doubles(d.preds),
             target = doubles(d.target);
  std::vector<double> tp(3), fp(3), fn(3);
  double squared = 0, sum = 0;
  for (int64_t i = begin; i < end; ++i) {
    const auto row = doubles(d.scores[i]);
    const auto predicted = std::max_element(row.begin(), row.end()) - row.begin();
    const auto actual = static_cast<int64_t>(labels[i]);
    if (predicted == actual) {
      tp[actual] += 1;
    } else {
      fp[predicted] += 1;
      fn[actual] += 1;
    }
    squared += (preds[i] - target[i]) * (preds[i] - target[i]);
    sum += preds[i];
  }
  Reference r;
  int present = 0;
  for (int k = 0; k < 3; ++k) {
    if (tp[k] + fp[k] + fn[k] == 0) continue;
    ++present;
    r.accuracy += tp[k] + fn[k] > 0 ? tp[k] / (tp[k] + fn[k]) : 0.0;
    r.f1 += 2 * tp[k] / (2 * tp[k] + fp[k] + fn[k]);
  }
  r.accuracy /= present;
  r.f1 /= present;
  double wins = 0, pairs = 0;
  for (int64_t i = begin; i < end; ++i)
    for (int64_t j = begin; j < end; ++j)
      if (binary[i] == 1 && binary[j] == 0) {
        wins += probs[i] > probs[j] ? 1.0 : probs[i] == probs[j] ? 0.5 : 0.0;
        pairs += 1;
      }
  r.auroc = pairs > 0 ? wins / pairs : 0.0;
  r.mse = squared / static_cast<double>(end - begin);
  r.mean = sum / static_cast<double>(end - begin);
  return r;
}

double read(const std::string& path, const std::string& name) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::Tensor t;
  archive.read(name, t);
  return t.item<double>();
}

TEST(DistributedMetrics, TwoRanksWithUnequalShardsMatchOneProcessOverAllSamples) {
  fulgor::test::TempDir dir;
  auto [status, log] = fulgor::test::run_two_ranks({"metrics", dir.str()}, dir / "log");
  ASSERT_TRUE(fulgor::test::exited_with(status, 0)) << log;
  const auto d = fulgor::test::make_metric_data();
  const Reference all = reference(d, 0, kMetricSamples);
  const Reference shards[2] = {reference(d, 0, kMetricShard0), reference(d, kMetricShard0, kMetricSamples)};
  // Unequal shards make the mean of the ranks' values differ from the value
  // over all samples, so the test tells them apart.
  EXPECT_GT(std::abs((shards[0].mse + shards[1].mse) / 2 - all.mse), 1e-3);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = dir / ("metrics_rank" + std::to_string(rank) + ".pt");
    const Reference& own = shards[rank];
    EXPECT_NEAR(read(file, "accuracy"), all.accuracy, 1e-12) << "rank " << rank;
    EXPECT_NEAR(read(file, "f1"), all.f1, 1e-12) << "rank " << rank;
    EXPECT_NEAR(read(file, "auroc"), all.auroc, 1e-12) << "rank " << rank;
    EXPECT_NEAR(read(file, "mse"), all.mse, 1e-12) << "rank " << rank;
    EXPECT_NEAR(read(file, "mean"), all.mean, 1e-6) << "rank " << rank;
    // Computing over the ranks left each rank's own state as it was.
    EXPECT_NEAR(read(file, "accuracy_local"), own.accuracy, 1e-12) << "rank " << rank;
    EXPECT_NEAR(read(file, "f1_local"), own.f1, 1e-12) << "rank " << rank;
    EXPECT_NEAR(read(file, "auroc_local"), own.auroc, 1e-12) << "rank " << rank;
    EXPECT_NEAR(read(file, "mse_local"), own.mse, 1e-12) << "rank " << rank;
    EXPECT_NEAR(read(file, "mean_local"), own.mean, 1e-6) << "rank " << rank;
  }
}

}  // namespace
