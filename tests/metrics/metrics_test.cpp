// fulgor::metrics against references written out as scikit-learn defines each
// metric: plain loops over std::vector, fed to the metrics in batches whose
// last one is shorter.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/metrics.h"

namespace fulgor::metrics {
namespace {

std::vector<double> doubles(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kDouble).contiguous().reshape({-1});
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}
std::vector<int64_t> longs(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kLong).contiguous().reshape({-1});
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Updates `metric` with rows [0, n) in batches of `size` (the last one shorter
// when size does not divide n).
void feed(PredictionMetric& metric, const torch::Tensor& preds, const torch::Tensor& target, int64_t size) {
  for (int64_t begin = 0; begin < target.size(0); begin += size) {
    const int64_t length = std::min(size, target.size(0) - begin);
    metric.update(preds.narrow(0, begin, length), target.narrow(0, begin, length));
  }
}

// ---- References ---------------------------------------------------------------

struct Counts {
  std::vector<double> tp, fp, fn;
};

// Per-class counts, a sample predicting its top_k classes.
Counts multiclass_counts(const std::vector<std::vector<double>>& scores, const std::vector<int64_t>& target,
                         int64_t classes, int64_t top_k) {
  Counts c{std::vector<double>(classes), std::vector<double>(classes), std::vector<double>(classes)};
  for (size_t i = 0; i < target.size(); ++i) {
    std::vector<int64_t> order(classes);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[i][a] > scores[i][b]; });
    const std::set<int64_t> predicted(order.begin(), order.begin() + top_k);
    for (int64_t k = 0; k < classes; ++k) {
      const bool p = predicted.count(k) > 0, t = target[i] == k;
      c.tp[k] += p && t;
      c.fp[k] += p && !t;
      c.fn[k] += !p && t;
    }
  }
  return c;
}

double ratio(double a, double b) { return b == 0 ? 0.0 : a / b; }

// scikit-learn's average="macro": the mean over the labels present in the
// targets or the predictions.
template <typename Score>
double macro(const Counts& c, Score score) {
  double sum = 0;
  int present = 0;
  for (size_t k = 0; k < c.tp.size(); ++k) {
    if (c.tp[k] + c.fp[k] + c.fn[k] == 0) continue;
    sum += score(c.tp[k], c.fp[k], c.fn[k]);
    ++present;
  }
  return sum / present;
}

template <typename Score>
double micro(const Counts& c, Score score) {
  const auto total = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); };
  return score(total(c.tp), total(c.fp), total(c.fn));
}

const auto kPrecision = [](double tp, double fp, double) { return ratio(tp, tp + fp); };
const auto kRecall = [](double tp, double, double fn) { return ratio(tp, tp + fn); };
const auto kF1 = [](double tp, double fp, double fn) { return ratio(2 * tp, 2 * tp + fp + fn); };

// ROC AUC as the probability that a random positive outscores a random
// negative, ties counting one half: equal to the trapezoidal area under the
// exact ROC curve.
double auroc_reference(const std::vector<double>& scores, const std::vector<int64_t>& target) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i)
    for (size_t j = 0; j < scores.size(); ++j)
      if (target[i] == 1 && target[j] == 0) {
        wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
        pairs += 1;
      }
  return wins / pairs;
}

std::vector<std::vector<double>> rows(const torch::Tensor& t) {
  std::vector<std::vector<double>> result;
  for (int64_t i = 0; i < t.size(0); ++i) result.push_back(doubles(t[i]));
  return result;
}

double value(const Metric& metric) { return metric.compute().item<double>(); }

ClassificationOptions multiclass(int64_t classes, int64_t top_k = 1, std::string average = "micro") {
  ClassificationOptions o;
  o.task = "multiclass";
  o.num_classes = classes;
  o.top_k = top_k;
  o.average = std::move(average);
  return o;
}

// ---- Tests --------------------------------------------------------------------

TEST(Metrics, BinaryScoresMatchTheReferenceOverUnevenBatches) {
  torch::manual_seed(1);
  const torch::Tensor probs = torch::rand({23}), target = torch::randint(0, 2, {23});
  const auto p = doubles(probs);
  const auto t = longs(target);
  double tp = 0, fp = 0, tn = 0, fn = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const bool predicted = p[i] > 0.5;
    tp += predicted && t[i] == 1;
    fp += predicted && t[i] == 0;
    tn += !predicted && t[i] == 0;
    fn += !predicted && t[i] == 1;
  }
  Accuracy accuracy;
  Precision precision;
  Recall recall;
  F1Score f1;
  for (PredictionMetric* m : std::vector<PredictionMetric*>{&accuracy, &precision, &recall, &f1})
    feed(*m, probs, target, 5);
  EXPECT_DOUBLE_EQ(value(accuracy), (tp + tn) / t.size());
  EXPECT_DOUBLE_EQ(value(precision), ratio(tp, tp + fp));
  EXPECT_DOUBLE_EQ(value(recall), ratio(tp, tp + fn));
  EXPECT_DOUBLE_EQ(value(f1), ratio(2 * tp, 2 * tp + fp + fn));
  EXPECT_EQ(accuracy.update_count(), 5);
}

TEST(Metrics, BinaryLogitsGoThroughTheSigmoid) {
  // Scores outside [0, 1] are logits: a logit above 0 is the positive class.
  const torch::Tensor logits = torch::tensor({-2.0, 0.3, 1.5, -0.1}), target = torch::tensor({0, 1, 0, 0});
  Accuracy accuracy;
  accuracy.update(logits, target);
  EXPECT_DOUBLE_EQ(value(accuracy), 0.75);
  ClassificationOptions high;
  high.threshold = 0.9;
  Accuracy labels(high);
  labels.update(torch::tensor({0.95, 0.8}), torch::tensor({1, 1}));
  EXPECT_DOUBLE_EQ(value(labels), 0.5);
}

TEST(Metrics, MulticlassTopKMatchesTheReference) {
  torch::manual_seed(2);
  const int64_t classes = 5;
  const torch::Tensor scores = torch::randn({37, classes}), target = torch::randint(0, classes, {37});
  const auto s = rows(scores);
  const auto t = longs(target);
  for (int64_t top_k : {1, 2, 3}) {
    const Counts c = multiclass_counts(s, t, classes, top_k);
    // A sample is a hit for the class of its target when that is among its top_k.
    const double hits = std::accumulate(c.tp.begin(), c.tp.end(), 0.0);
    const ClassificationOptions micro_options = multiclass(classes, top_k);
    const ClassificationOptions macro_options = multiclass(classes, top_k, "macro");
    Accuracy micro_accuracy(micro_options), macro_accuracy(macro_options);
    feed(micro_accuracy, scores, target, 8);
    feed(macro_accuracy, scores, target, 8);
    EXPECT_DOUBLE_EQ(value(micro_accuracy), hits / t.size()) << "top_k " << top_k;
    // Macro accuracy is the mean of the classes' recalls (over the classes
    // in the targets when top_k > 1: every class is then predicted).
    double recall_sum = 0;
    int present = 0;
    for (int64_t k = 0; k < classes; ++k)
      if (c.tp[k] + c.fn[k] > 0) {
        recall_sum += c.tp[k] / (c.tp[k] + c.fn[k]);
        ++present;
      }
    EXPECT_NEAR(value(macro_accuracy), recall_sum / present, 1e-12) << "top_k " << top_k;
  }
}

TEST(Metrics, MacroAveragesLeaveOutClassesNeverSeen) {
  // Four classes; class 2 appears only in the last, shorter batch, class 3
  // nowhere: scikit-learn's macro average is over classes 0, 1 and 2.
  const torch::Tensor target = torch::tensor({0, 1, 1, 0, 0, 1, 1, 0, 2, 2});
  const torch::Tensor preds = torch::tensor({0, 1, 0, 0, 1, 1, 1, 0, 2, 1});
  const auto t = longs(target), p = longs(preds);
  std::vector<std::vector<double>> one_hot(t.size(), std::vector<double>(4));
  for (size_t i = 0; i < p.size(); ++i) one_hot[i][p[i]] = 1;
  const Counts c = multiclass_counts(one_hot, t, 4, 1);
  const ClassificationOptions macro_options = multiclass(4, 1, "macro");
  const ClassificationOptions micro_options = multiclass(4);
  Precision precision(macro_options), micro_precision(micro_options);
  Recall recall(macro_options);
  F1Score f1(macro_options), micro_f1(micro_options);
  Accuracy accuracy(macro_options);
  for (PredictionMetric* m :
       std::vector<PredictionMetric*>{&precision, &micro_precision, &recall, &f1, &micro_f1, &accuracy})
    feed(*m, preds, target, 4);
  EXPECT_NEAR(value(precision), macro(c, kPrecision), 1e-12);
  EXPECT_NEAR(value(recall), macro(c, kRecall), 1e-12);
  EXPECT_NEAR(value(f1), macro(c, kF1), 1e-12);
  EXPECT_NEAR(value(accuracy), macro(c, kRecall), 1e-12);
  EXPECT_NEAR(value(micro_precision), micro(c, kPrecision), 1e-12);
  EXPECT_NEAR(value(micro_f1), micro(c, kF1), 1e-12);
  // By hand: precision per class 3/4, 3/5, 1/1.
  EXPECT_NEAR(value(precision), (0.75 + 0.6 + 1.0) / 3, 1e-12);

  Recall per_class(multiclass(4, 1, "none"));
  feed(per_class, preds, target, 4);
  EXPECT_TRUE(per_class.compute().allclose(torch::tensor({0.75, 0.75, 0.5, 0.0}, torch::kDouble)))
      << per_class.compute();
}

TEST(Metrics, ConfusionMatrixCountsTargetRowsAndPredictedColumns) {
  torch::manual_seed(3);
  const torch::Tensor scores = torch::randn({19, 3}), target = torch::randint(0, 3, {19});
  const auto s = rows(scores);
  const auto t = longs(target);
  std::vector<std::vector<double>> expected(3, std::vector<double>(3));
  for (size_t i = 0; i < t.size(); ++i) expected[t[i]][std::max_element(s[i].begin(), s[i].end()) - s[i].begin()] += 1;
  ConfusionMatrix counts(multiclass(3));
  ConfusionMatrix by_row(multiclass(3), "true");
  feed(counts, scores, target, 4);
  feed(by_row, scores, target, 4);
  const torch::Tensor cm = counts.compute(), normalized = by_row.compute();
  ASSERT_EQ(cm.sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(cm.scalar_type(), torch::kLong);
  for (int64_t i = 0; i < 3; ++i) {
    const double row = std::accumulate(expected[i].begin(), expected[i].end(), 0.0);
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(cm[i][j].item<double>(), expected[i][j]) << i << "," << j;
      EXPECT_NEAR(normalized[i][j].item<double>(), ratio(expected[i][j], row), 1e-12);
    }
  }

  ConfusionMatrix binary;
  binary.update(torch::tensor({0.9, 0.2, 0.7, 0.4, 0.6}), torch::tensor({1, 1, 0, 0, 1}));
  EXPECT_TRUE(binary.compute().equal(torch::tensor({{1, 1}, {1, 2}}, torch::kLong))) << binary.compute();
}

TEST(Metrics, AurocIsTheExactTrapezoidalArea) {
  torch::manual_seed(4);
  // Scores rounded to tenths, so that ties between positives and negatives occur.
  const torch::Tensor scores = (torch::rand({41}) * 10).round() / 10, target = torch::randint(0, 2, {41});
  AUROC auroc;
  feed(auroc, scores, target, 6);
  EXPECT_NEAR(value(auroc), auroc_reference(doubles(scores), longs(target)), 1e-12);

  // By hand: positives 0.8, 0.4; negatives 0.4, 0.1: pairs won 1 + 1 + 0.5 + 1 of 4.
  AUROC small;
  small.update(torch::tensor({0.8, 0.4, 0.4, 0.1}), torch::tensor({1, 1, 0, 0}));
  EXPECT_DOUBLE_EQ(value(small), 0.875);
  AUROC one_class;
  one_class.update(torch::tensor({0.8, 0.4}), torch::tensor({1, 1}));
  EXPECT_DOUBLE_EQ(value(one_class), 0.0);
}

TEST(Metrics, RegressionErrorsAndWeightedMeanMatchTheReference) {
  torch::manual_seed(5);
  const torch::Tensor preds = torch::randn({17, 2}), target = torch::randn({17, 2});
  const auto p = doubles(preds), t = doubles(target);
  double squared = 0, absolute = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    squared += (p[i] - t[i]) * (p[i] - t[i]);
    absolute += std::abs(p[i] - t[i]);
  }
  MeanSquaredError mse;
  MeanSquaredError rmse(/*squared=*/false);
  MeanAbsoluteError mae;
  feed(mse, preds, target, 5);
  feed(rmse, preds, target, 5);
  feed(mae, preds, target, 5);
  EXPECT_NEAR(value(mse), squared / p.size(), 1e-12);
  EXPECT_NEAR(value(rmse), std::sqrt(squared / p.size()), 1e-12);
  EXPECT_NEAR(value(mae), absolute / p.size(), 1e-12);

  // Batch means weighted by their batch sizes give the mean over the samples.
  MeanMetric mean;
  double sum = 0, weight = 0;
  for (int64_t begin = 0; begin < 17; begin += 5) {
    const int64_t length = std::min<int64_t>(5, 17 - begin);
    const torch::Tensor batch = preds.narrow(0, begin, length).to(torch::kDouble);
    mean.update(batch.mean(), static_cast<double>(length));
    for (double v : doubles(batch)) sum += v;
    weight += length;
  }
  EXPECT_NEAR(value(mean), sum / (2 * weight), 1e-12);
  MeanMetric with_nan;
  with_nan.update(torch::tensor({1.0, std::nan(""), 3.0}), torch::tensor({1.0, 5.0, 3.0}));
  EXPECT_DOUBLE_EQ(value(with_nan), (1.0 + 9.0) / 4.0);
}

TEST(Metrics, ForwardGivesTheBatchValueAndAccumulates) {
  Accuracy accuracy(multiclass(3));
  const torch::Tensor first = accuracy(torch::tensor({0, 1, 2, 2}), torch::tensor({0, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(first.item<double>(), 0.5);
  const torch::Tensor second = accuracy.forward(torch::tensor({1, 1}), torch::tensor({1, 1}));
  EXPECT_DOUBLE_EQ(second.item<double>(), 1.0);
  EXPECT_TRUE(accuracy.batch_value().equal(second));
  EXPECT_DOUBLE_EQ(value(accuracy), 4.0 / 6.0);
  EXPECT_EQ(accuracy.update_count(), 2);
  // Refused inputs leave the state, the count and the batch value as they were.
  EXPECT_THROW(accuracy.forward(torch::tensor({1.0}), torch::tensor({1})), ConfigError);
  EXPECT_DOUBLE_EQ(value(accuracy), 4.0 / 6.0);
  EXPECT_EQ(accuracy.update_count(), 2);
  EXPECT_TRUE(accuracy.batch_value().equal(second));

  AUROC auroc;
  auroc(torch::tensor({0.9, 0.1}), torch::tensor({1, 0}));
  EXPECT_DOUBLE_EQ(auroc(torch::tensor({0.2, 0.3}), torch::tensor({1, 0})).item<double>(), 0.0);
  EXPECT_DOUBLE_EQ(value(auroc), 0.75);  // pairs 0.9>0.1, 0.9>0.3, 0.2>0.1, 0.2<0.3

  accuracy.reset();
  EXPECT_EQ(accuracy.update_count(), 0);
  EXPECT_FALSE(accuracy.batch_value().defined());
  EXPECT_DOUBLE_EQ(value(accuracy), 0.0);
  accuracy.update(torch::tensor({2}), torch::tensor({2}));
  EXPECT_DOUBLE_EQ(value(accuracy), 1.0);
}

TEST(Metrics, StateFollowsTheInputsDevice) {
  // The meta device stands for an accelerator: the state moves there with
  // the first inputs and is computed there.
  MeanSquaredError mse;
  EXPECT_TRUE(mse.device().is_cpu());
  const torch::Device meta(torch::kMeta);
  mse.update(torch::zeros({3}, meta), torch::zeros({3}, meta));
  EXPECT_EQ(mse.device(), meta);
  EXPECT_EQ(mse.compute().device(), meta);
  mse.reset();
  EXPECT_EQ(mse.compute().device(), meta) << "reset keeps the state's device";
  MeanAbsoluteError moved;
  moved.to(meta);
  EXPECT_EQ(moved.compute().device(), meta);
}

TEST(Metrics, RefuseBadArgumentsNamingThem) {
  const auto message = [](auto make) {
    try {
      make();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no ConfigError");
  };
  EXPECT_NE(message([] {
              ClassificationOptions o;
              o.task = "multilabel";
              Accuracy{o};
            }).find("unknown task 'multilabel'"),
            std::string::npos);
  EXPECT_NE(message([] { Precision{multiclass(0)}; }).find("num_classes of at least 2, got 0"), std::string::npos);
  EXPECT_NE(message([] { Recall{multiclass(3, 4)}; }).find("got 4"), std::string::npos);
  EXPECT_NE(message([] {
              F1Score{multiclass(3, 1, "weighted")};
            }).find("unknown average 'weighted'; known: micro, macro, none"),
            std::string::npos);
  EXPECT_NE(message([] { ConfusionMatrix({}, "rows"); }).find("unknown normalize 'rows'"), std::string::npos);
  EXPECT_NE(message([] { AUROC{"multiclass"}; }).find("unknown task 'multiclass'"), std::string::npos);
  EXPECT_NE(message([] {
              Accuracy a(multiclass(3, 2));
              a.update(torch::tensor({1, 2}), torch::tensor({1, 2}));
            }).find("preds must be [2, 3] floating-point scores, got [2]"),
            std::string::npos);
  EXPECT_NE(message([] {
              MeanSquaredError m;
              m.update(torch::zeros({2}), torch::zeros({3}));
            }).find("preds [2] and target [3] must have the same shape"),
            std::string::npos);
}

}  // namespace
}  // namespace fulgor::metrics
