#include "fulgor/metrics/classification.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "fulgor/core/error.h"

namespace fulgor::metrics {
namespace {

std::string shape_of(const torch::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

// [N, C] with a 1 at each sample's class. LibTorch's one_hot reads the
// indices' range on the host on some devices; scatter_ does not.
torch::Tensor indicator(const torch::Tensor& classes, int64_t c) {
  const torch::Tensor index = classes.to(torch::kLong).reshape({-1, 1});
  return torch::zeros({index.size(0), c}, index.options()).scatter_(1, index, 1);
}

void check_task(const ClassificationOptions& o, const char* metric) {
  if (o.task != "binary" && o.task != "multiclass")
    throw ConfigError(fmt::format("{}: unknown task '{}'; known: binary, multiclass", metric, o.task));
  if (o.task == "multiclass" && o.num_classes < 2)
    throw ConfigError(
        fmt::format("{}: task 'multiclass' needs num_classes of at least 2, got {}", metric, o.num_classes));
}

// A / B, with 0 where B is 0 (torchmetrics' _safe_divide).
torch::Tensor safe_divide(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor num = a.to(torch::kDouble), den = b.to(torch::kDouble);
  return torch::where(den == 0, torch::zeros_like(num), num / torch::where(den == 0, torch::ones_like(den), den));
}

// Binary predictions as 0/1 (int64): probabilities or logits thresholded,
// labels as they are. The sigmoid is chosen on the device, without reading
// the scores on the host.
torch::Tensor binary_labels(const torch::Tensor& preds, double threshold) {
  if (!preds.is_floating_point()) return preds.to(torch::kLong);
  const torch::Tensor outside = (preds < 0).logical_or(preds > 1).any();
  const torch::Tensor probs = torch::where(outside, preds.sigmoid(), preds);
  return (probs > threshold).to(torch::kLong);
}

void check_same_shape(const torch::Tensor& preds, const torch::Tensor& target, const char* metric) {
  if (preds.sizes() != target.sizes())
    throw ConfigError(
        fmt::format("{}: preds {} and target {} must have the same shape", metric, shape_of(preds), shape_of(target)));
}

// Multiclass predictions as a one-hot (or top_k-hot) [N, C] int64 matrix.
torch::Tensor multiclass_hits(const torch::Tensor& preds, const torch::Tensor& target, const ClassificationOptions& o,
                              const char* metric) {
  if (target.dim() != 1)
    throw ConfigError(fmt::format("{}: target must be [N] class indices, got {}", metric, shape_of(target)));
  const int64_t n = target.size(0), c = o.num_classes;
  if (preds.dim() == 2 && preds.size(0) == n && preds.size(1) == c && preds.is_floating_point()) {
    const torch::Tensor top = std::get<1>(preds.topk(o.top_k, /*dim=*/1));
    return torch::zeros({n, c}, preds.options().dtype(torch::kLong)).scatter_(1, top, 1);
  }
  if (preds.dim() == 1 && preds.size(0) == n && !preds.is_floating_point() && o.top_k == 1) return indicator(preds, c);
  throw ConfigError(fmt::format("{}: with target {}, preds must be [{}, {}] floating-point scores{}, got {} of {}",
                                metric, shape_of(target), n, c,
                                o.top_k == 1 ? fmt::format(" or [{}] class indices", n) : std::string(),
                                shape_of(preds), c10::toString(preds.scalar_type())));
}

}  // namespace

StatScores::StatScores(ClassificationOptions options, const char* metric) : options_(std::move(options)) {
  check_task(options_, metric);
  if (options_.task == "multiclass" && (options_.top_k < 1 || options_.top_k > options_.num_classes))
    throw ConfigError(fmt::format("{}: top_k must be from 1 to num_classes ({}), got {}", metric, options_.num_classes,
                                  options_.top_k));
  if (options_.task == "binary" && options_.top_k != 1)
    throw ConfigError(fmt::format("{}: top_k {} needs task 'multiclass'", metric, options_.top_k));
  if (options_.average != "micro" && options_.average != "macro" && options_.average != "none")
    throw ConfigError(fmt::format("{}: unknown average '{}'; known: micro, macro, none", metric, options_.average));
  const int64_t classes = options_.task == "binary" ? 1 : options_.num_classes;
  const torch::Tensor zeros = torch::zeros({classes}, torch::kLong);
  tp_ = add_state(zeros, Merge::sum);
  fp_ = add_state(zeros, Merge::sum);
  tn_ = add_state(zeros, Merge::sum);
  fn_ = add_state(zeros, Merge::sum);
}

void StatScores::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  torch::NoGradGuard no_grad;
  torch::Tensor predicted, actual;  // [N, C] of 0 and 1
  if (options_.task == "binary") {
    check_same_shape(preds, target, "binary classification");
    predicted = binary_labels(preds, options_.threshold).reshape({-1, 1});
    actual = target.to(torch::kLong).reshape({-1, 1});
  } else {
    predicted = multiclass_hits(preds, target, options_, "multiclass classification");
    actual = indicator(target, options_.num_classes);
  }
  const torch::Tensor tp = (predicted * actual).sum(0), fp = (predicted * (1 - actual)).sum(0),
                      fn = ((1 - predicted) * actual).sum(0);
  state(tp_).add_(tp);
  state(fp_).add_(fp);
  state(fn_).add_(fn);
  state(tn_).add_(actual.size(0) - tp - fp - fn);
}

torch::Tensor StatScores::compute_from(const std::vector<torch::Tensor>& s) const {
  const torch::Tensor &tp = s[tp_], &fp = s[fp_], &tn = s[tn_], &fn = s[fn_];
  if (options_.task == "binary") return score(tp, fp, tn, fn).reshape({});
  if (options_.average == "micro") return score(tp.sum(), fp.sum(), tn.sum(), fn.sum());
  const torch::Tensor per_class = score(tp, fp, tn, fn);
  if (options_.average == "none") return per_class;
  // Macro: classes that appear in neither targets nor predictions have no
  // score (with top_k > 1 every class is predicted: those absent from the
  // targets), as torchmetrics' _adjust_weights_safe_divide.
  const torch::Tensor absent = options_.top_k == 1 ? (tp + fp + fn) == 0 : (tp + fn) == 0;
  const torch::Tensor weights = (~absent).to(torch::kDouble);
  return safe_divide((weights * per_class).sum(), weights.sum());
}

torch::Tensor Accuracy::score(const torch::Tensor& tp, const torch::Tensor& fp, const torch::Tensor& tn,
                              const torch::Tensor& fn) const {
  if (options_.task == "binary") return safe_divide(tp + tn, tp + tn + fp + fn);
  return safe_divide(tp, tp + fn);
}

torch::Tensor Precision::score(const torch::Tensor& tp, const torch::Tensor& fp, const torch::Tensor&,
                               const torch::Tensor&) const {
  return safe_divide(tp, tp + fp);
}

torch::Tensor Recall::score(const torch::Tensor& tp, const torch::Tensor&, const torch::Tensor&,
                            const torch::Tensor& fn) const {
  return safe_divide(tp, tp + fn);
}

torch::Tensor F1Score::score(const torch::Tensor& tp, const torch::Tensor& fp, const torch::Tensor&,
                             const torch::Tensor& fn) const {
  return safe_divide(2 * tp, 2 * tp + fp + fn);
}

// ---- ConfusionMatrix ----------------------------------------------------------

ConfusionMatrix::ConfusionMatrix(ClassificationOptions options, std::string normalize)
    : options_(std::move(options)), normalize_(std::move(normalize)) {
  check_task(options_, "ConfusionMatrix");
  if (normalize_ != "none" && normalize_ != "true" && normalize_ != "pred" && normalize_ != "all")
    throw ConfigError(fmt::format("ConfusionMatrix: unknown normalize '{}'; known: none, true, pred, all", normalize_));
  if (options_.top_k != 1) throw ConfigError(fmt::format("ConfusionMatrix: top_k must be 1, got {}", options_.top_k));
  classes_ = options_.task == "binary" ? 2 : options_.num_classes;
  counts_ = add_state(torch::zeros({classes_ * classes_}, torch::kLong), Merge::sum);
}

void ConfusionMatrix::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  torch::NoGradGuard no_grad;
  torch::Tensor predicted;
  if (options_.task == "binary") {
    check_same_shape(preds, target, "ConfusionMatrix");
    predicted = binary_labels(preds, options_.threshold).reshape({-1});
  } else {
    predicted = multiclass_hits(preds, target, options_, "ConfusionMatrix").argmax(1);
  }
  // index_add_ rather than bincount, which reads the largest index on the host.
  const torch::Tensor index = target.to(torch::kLong).reshape({-1}) * classes_ + predicted;
  state(counts_).index_add_(0, index, torch::ones_like(index));
}

torch::Tensor ConfusionMatrix::compute_from(const std::vector<torch::Tensor>& s) const {
  const torch::Tensor counts = s[counts_].reshape({classes_, classes_});
  if (normalize_ == "none") return counts.clone();  // not a view of the state
  if (normalize_ == "true") return safe_divide(counts, counts.sum(1, /*keepdim=*/true));
  if (normalize_ == "pred") return safe_divide(counts, counts.sum(0, /*keepdim=*/true));
  return safe_divide(counts, counts.sum());
}

// ---- AUROC ------------------------------------------------------------------

AUROC::AUROC(std::string task) {
  if (task != "binary") throw ConfigError(fmt::format("AUROC: unknown task '{}'; known: binary", task));
  preds_ = add_state(torch::zeros({0}, torch::kDouble), Merge::cat);
  target_ = add_state(torch::zeros({0}, torch::kLong), Merge::cat);
}

void AUROC::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  check_same_shape(preds, target, "AUROC");
  if (!preds.is_floating_point())
    throw ConfigError(
        fmt::format("AUROC: preds must be floating-point scores, got {}", c10::toString(preds.scalar_type())));
  torch::NoGradGuard no_grad;
  const torch::Tensor scores = preds.to(torch::kDouble);
  const torch::Tensor outside = (scores < 0).logical_or(scores > 1).any();
  append(preds_, torch::where(outside, scores.sigmoid(), scores));
  append(target_, target.to(torch::kLong));
}

torch::Tensor AUROC::compute_from(const std::vector<torch::Tensor>& s) const {
  // torchmetrics' _binary_clf_curve: scores in decreasing order; the true
  // and false positives at each distinct score, counting all its ties.
  const torch::Tensor order = std::get<1>(s[preds_].sort(/*dim=*/0, /*descending=*/true));
  const torch::Tensor scores = s[preds_].index_select(0, order);
  const torch::Tensor target = s[target_].index_select(0, order).to(torch::kDouble);
  const int64_t n = scores.size(0);
  if (n == 0) return torch::zeros({}, scores.options());
  const torch::Tensor last_of_value = torch::cat({(scores.narrow(0, 1, n - 1) != scores.narrow(0, 0, n - 1)),
                                                  torch::ones({1}, scores.options().dtype(torch::kBool))});
  const torch::Tensor ends = last_of_value.nonzero().reshape({-1});
  const torch::Tensor tps = target.cumsum(0).index_select(0, ends);
  const torch::Tensor fps = (ends + 1).to(torch::kDouble) - tps;
  const torch::Tensor zero = torch::zeros({1}, tps.options());
  const torch::Tensor tpr = safe_divide(torch::cat({zero, tps}), tps[-1]);
  const torch::Tensor fpr = safe_divide(torch::cat({zero, fps}), fps[-1]);
  const int64_t m = tpr.size(0);
  const torch::Tensor widths = fpr.narrow(0, 1, m - 1) - fpr.narrow(0, 0, m - 1);
  const torch::Tensor heights = tpr.narrow(0, 1, m - 1) + tpr.narrow(0, 0, m - 1);
  return (widths * heights).sum() / 2;
}

}  // namespace fulgor::metrics
