#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "fulgor/core/export.h"
#include "fulgor/metrics/metric.h"

namespace fulgor::metrics {

/// The arguments of torchmetrics' classification metrics, with their names
/// and meanings.
struct FULGOR_API ClassificationOptions {
  /// "binary" or "multiclass".
  std::string task = "binary";
  /// multiclass: the number of classes (at least 2).
  int64_t num_classes = 0;
  /// binary: a floating-point prediction above it is the positive class.
  double threshold = 0.5;
  /// multiclass: a sample counts as a hit for each of its top_k scores.
  int64_t top_k = 1;
  /// multiclass: "micro" (the counts of all classes summed, then the score),
  /// "macro" (the unweighted mean of the classes' scores, over the classes
  /// seen in the targets or predictions) or "none" (each class's score).
  std::string average = "micro";
};

/// True and false positives and negatives per class (torchmetrics'
/// StatScores), the state behind Accuracy, Precision, Recall and F1Score.
///
/// Inputs of update(preds, target):
///   - binary: preds and target of one shape. Floating-point preds are
///     probabilities, or logits when any lies outside [0, 1] (then the
///     sigmoid is applied, as torchmetrics does); the positive class is a
///     value above `threshold`. Integral preds and the target are 0 or 1.
///   - multiclass: target [N] of class indices; preds [N] of class indices
///     (top_k 1 only) or [N, num_classes] of scores, of which the top_k
///     highest are the predicted classes.
/// compute() of a metric with a division by zero in it (no positive
/// predictions for Precision) gives 0 there, as torchmetrics' zero_division.
class FULGOR_API StatScores : public PredictionMetric {
 public:
  const ClassificationOptions& options() const { return options_; }

 protected:
  explicit StatScores(ClassificationOptions options, const char* metric);

  /// The score per class from the counts (each [C]; [1] for binary).
  virtual torch::Tensor score(const torch::Tensor& tp, const torch::Tensor& fp, const torch::Tensor& tn,
                              const torch::Tensor& fn) const = 0;
  torch::Tensor compute_from(const std::vector<torch::Tensor>& states) const override;
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;

  ClassificationOptions options_;
  size_t tp_, fp_, tn_, fn_;
};

/// The fraction of correct predictions. binary: (tp + tn) / all; multiclass
/// micro: samples whose target is among the top_k predictions / samples;
/// macro: the mean over classes of each class's recall.
class FULGOR_API Accuracy final : public StatScores {
 public:
  explicit Accuracy(ClassificationOptions options = {}) : StatScores(std::move(options), "Accuracy") {}

 private:
  torch::Tensor score(const torch::Tensor& tp, const torch::Tensor& fp, const torch::Tensor& tn,
                      const torch::Tensor& fn) const override;
};

/// tp / (tp + fp).
class FULGOR_API Precision final : public StatScores {
 public:
  explicit Precision(ClassificationOptions options = {}) : StatScores(std::move(options), "Precision") {}

 private:
  torch::Tensor score(const torch::Tensor& tp, const torch::Tensor& fp, const torch::Tensor& tn,
                      const torch::Tensor& fn) const override;
};

/// tp / (tp + fn).
class FULGOR_API Recall final : public StatScores {
 public:
  explicit Recall(ClassificationOptions options = {}) : StatScores(std::move(options), "Recall") {}

 private:
  torch::Tensor score(const torch::Tensor& tp, const torch::Tensor& fp, const torch::Tensor& tn,
                      const torch::Tensor& fn) const override;
};

/// 2 tp / (2 tp + fp + fn), the harmonic mean of precision and recall.
class FULGOR_API F1Score final : public StatScores {
 public:
  explicit F1Score(ClassificationOptions options = {}) : StatScores(std::move(options), "F1Score") {}

 private:
  torch::Tensor score(const torch::Tensor& tp, const torch::Tensor& fp, const torch::Tensor& tn,
                      const torch::Tensor& fn) const override;
};

/// Counts of (target, prediction) pairs: compute() gives a [C, C] matrix
/// whose row is the target class and column the predicted class (C = 2 for
/// binary), as scikit-learn's confusion_matrix. `normalize`: "none" (int64
/// counts), "true" (each row sums to 1), "pred" (each column) or "all".
/// `options.top_k` and `average` do not apply. Inputs as StatScores.
class FULGOR_API ConfusionMatrix final : public PredictionMetric {
 public:
  explicit ConfusionMatrix(ClassificationOptions options = {}, std::string normalize = "none");

 private:
  torch::Tensor compute_from(const std::vector<torch::Tensor>& states) const override;
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;

  ClassificationOptions options_;
  std::string normalize_;
  int64_t classes_;
  size_t counts_;
};

/// The area under the ROC curve of a binary task, exact: every distinct
/// score is a threshold and the curve is integrated by the trapezoidal rule,
/// as torchmetrics' BinaryAUROC with thresholds=None and scikit-learn's
/// roc_auc_score. The state keeps every score and target (gathered from all
/// ranks by compute(group)). Inputs: preds of scores, target of 0 and 1, of
/// one shape; scores outside [0, 1] go through the sigmoid, as torchmetrics
/// does. Without both a positive and a negative target the value is 0.
class FULGOR_API AUROC final : public PredictionMetric {
 public:
  /// `task` must be "binary".
  explicit AUROC(std::string task = "binary");

 private:
  torch::Tensor compute_from(const std::vector<torch::Tensor>& states) const override;
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;

  size_t preds_, target_;
};

}  // namespace fulgor::metrics
