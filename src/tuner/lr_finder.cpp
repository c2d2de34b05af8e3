// The learning-rate range test: Lightning's tuner/lr_finder.py and
// callbacks/lr_finder.py.

#include "fulgor/callbacks/lr_finder.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <utility>

#include "fulgor/core/error.h"
#include "fulgor/module.h"
#include "fulgor/trainer.h"
#include "tuner/sweep.h"

namespace fulgor {

LRFinder::LRFinder(std::string mode, double min_lr, double max_lr, int64_t num_training, Results results)
    : mode_(std::move(mode)),
      min_lr_(min_lr),
      max_lr_(max_lr),
      num_training_(num_training),
      results_(std::move(results)) {}

std::optional<size_t> LRFinder::optimal_index(int64_t skip_begin, int64_t skip_end) const {
  if (skip_begin < 0 || skip_end < 0)
    throw ConfigError(
        fmt::format("LRFinder::suggestion(skip_begin={}, skip_end={}): expected counts >= 0", skip_begin, skip_end));
  // Python's [skip_begin:-skip_end], which is empty for skip_end 0.
  const auto n = static_cast<int64_t>(results_.loss.size());
  const int64_t first = std::min(skip_begin, n);
  const int64_t last = std::max(first, skip_end == 0 ? int64_t{0} : n - skip_end);
  const auto slice = [&](const std::vector<double>& v) {
    // torch.tensor of Python floats: float32, the default dtype.
    return torch::tensor(std::vector<double>(v.begin() + first, v.begin() + last), torch::kFloat64).to(torch::kFloat32);
  };
  torch::Tensor losses = slice(results_.loss), lrs = slice(results_.lr);
  const torch::Tensor is_finite = torch::isfinite(losses);
  losses = losses.index({is_finite});
  lrs = lrs.index({is_finite});
  if (losses.numel() < 2) return std::nullopt;  // torch.gradient needs two points
  const std::vector<torch::Tensor> spacing{lrs};
  const int64_t min_grad = torch::gradient(losses, spacing)[0].argmin().item<int64_t>();
  const torch::Tensor kept = torch::arange(first, last, torch::kLong).index({is_finite});
  return static_cast<size_t>(kept[min_grad].item<int64_t>());
}

std::optional<double> LRFinder::suggestion(int64_t skip_begin, int64_t skip_end) const {
  const auto index = optimal_index(skip_begin, skip_end);
  if (!index) return std::nullopt;
  return results_.lr[*index];
}

namespace {

// Lightning's _ExponentialLR and _LinearLR: the rate of the sweep's `step`-th
// optimizer step. Their schedulers keep the base rate at their initial step
// and rise from (step+1)/num_training after it, so the second step already
// skips a rate; the last is max_lr.
double sweep_rate(const LrFindOptions& o, int64_t step) {
  if (step == 0) return o.min_lr;
  const double r = static_cast<double>(step + 1) / static_cast<double>(o.num_training);
  if (o.mode == "linear") return o.min_lr + r * (o.max_lr - o.min_lr);
  return o.min_lr * std::pow(o.max_lr / o.min_lr, r);
}

// Lightning's _LRCallback: the sweep's rates, set before each step, and the
// smoothed losses, with the stop on divergence.
class LrRecorder final : public Callback {
 public:
  LrRecorder(const LrFindOptions& options, int64_t start_step) : o_(options), start_step_(start_step) {}

  void on_train_batch_start(Trainer& trainer, ModuleBase&, int64_t batch_idx) override {
    const double lr = sweep_rate(o_, trainer.global_step() - start_step_);
    for (auto& group : trainer.optimizers()[0]->param_groups()) group.options().set_lr(lr);
    if ((batch_idx + 1) % trainer.accumulate_grad_batches() != 0) return;
    results.lr.push_back(lr);
  }

  void on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor& loss, int64_t batch_idx) override {
    if ((batch_idx + 1) % trainer.accumulate_grad_batches() != 0) return;
    steps_taken = trainer.global_step() - start_step_;
    // A skipped batch: NaN, which the suggestion leaves out.
    if (!loss.defined()) return results.loss.push_back(std::numeric_limits<double>::quiet_NaN());
    const double current = loss.item<double>();
    // Note [Steps of a sweep later in a fit]
    // Lightning counts with global_step, so a sweep begun after the first
    // optimizer step (its FineTuneLearningRateFinder example) never records
    // a best loss, finds the first step "diverged" and stops there, and
    // corrects no bias. Counting the sweep's own steps is the same at the
    // start of a fit and makes a later sweep behave as one there.
    const int64_t step = steps_taken;
    avg_loss_ = kBeta * avg_loss_ + (1 - kBeta) * current;
    const double smoothed = avg_loss_ / (1 - std::pow(kBeta, static_cast<double>(step + 1)));
    const bool diverged = o_.early_stop_threshold && step > 1 && smoothed > *o_.early_stop_threshold * best_loss_;
    if (trainer.reduce_boolean_decision(diverged, /*all=*/false))
      trainer.request_stop("the learning-rate finder's loss diverged");
    if (smoothed < best_loss_ || step == 1) best_loss_ = smoothed;
    results.loss.push_back(smoothed);
  }

  LRFinder::Results results;
  int64_t steps_taken = 0;

 private:
  static constexpr double kBeta = 0.98;
  const LrFindOptions& o_;
  const int64_t start_step_;
  double avg_loss_ = 0.0, best_loss_ = 0.0;
};

// Lightning's _determine_lr_attr_name, over the module's hparams().
std::string lr_attr_name(const ModuleBase& module, const std::string& requested) {
  const auto& hparams = module.hparams();
  const auto has = [&](const std::string& key) { return hparams.is_object() && hparams.contains(key); };
  if (!requested.empty()) {
    if (has(requested)) return requested;
    throw ConfigError(fmt::format(
        "LearningRateFinder: attr_name=\"{}\", but the module's hparams() has no such key: save the learning rate "
        "there with save_hyperparameters, or name the key that holds it",
        requested));
  }
  for (const char* name : {"lr", "learning_rate"})
    if (has(name)) return name;
  throw ConfigError(
      "LearningRateFinder with update_attr: the module's hparams() has neither \"lr\" nor \"learning_rate\"; save "
      "the learning rate under one of them with save_hyperparameters (and read it in configure_optimizers), set "
      "attr_name to the key that holds it, or set update_attr to false");
}

void check_sweepable(const detail::TrainerState& s) {
  if (s.manual)
    throw ConfigError(
        "LearningRateFinder: the module optimizes manually; the learning rate finder needs automatic optimization");
  if (s.optim.optimizers.size() != 1)
    throw ConfigError(
        fmt::format("LearningRateFinder: `configure_optimizers()` returned {} optimizers, but the "
                    "learning rate finder only works with a single optimizer",
                    s.optim.optimizers.size()));
}

// Note [Applying the suggestion]
// As Lightning's, after the starting point is back: the module's
// hyper-parameter, which a later configure_optimizers reads, and the rate of
// every parameter group of the optimizers of the fit going on. Schedulers keep
// the base rates they had.
void apply_suggestion(detail::TrainerState& s, ModuleBase& module, const std::string& attr, double lr) {
  nlohmann::json hparams = module.hparams();
  hparams[attr] = lr;
  module.save_hyperparameters(std::move(hparams));
  for (auto& optimizer : s.optim.optimizers)
    for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
  s.info(fmt::format("Learning rate set to {}", lr));
}

}  // namespace

LearningRateFinder::LearningRateFinder(LrFindOptions options) : options_(std::move(options)) {
  auto& mode = options_.mode;
  std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::tolower(c); });
  if (mode != "exponential" && mode != "linear")
    throw ConfigError(
        fmt::format("LearningRateFinder: mode \"{}\": expected \"exponential\" or \"linear\"", options_.mode));
  if (options_.num_training < 1)
    throw ConfigError(
        fmt::format("LearningRateFinder: num_training={}: expected at least 1 step", options_.num_training));
  if (!(options_.min_lr > 0) || !(options_.max_lr > 0))
    throw ConfigError(
        fmt::format("LearningRateFinder: min_lr={}, max_lr={}: expected rates > 0", options_.min_lr, options_.max_lr));
}

void LearningRateFinder::on_fit_start(Trainer& trainer, ModuleBase& module) { lr_find(trainer, module); }

void LearningRateFinder::lr_find(Trainer& trainer, ModuleBase& module) {
  auto& s = detail::TrainerAccess::state(trainer);
  result_.reset();
  if (s.options.fast_dev_run > 0) {
    s.warn("Skipping learning rate finder since `fast_dev_run` is enabled.");
  } else {
    check_sweepable(s);
    const std::string attr = options_.update_attr ? lr_attr_name(module, options_.attr_name) : "";
    auto recorder = std::make_shared<LrRecorder>(options_, trainer.global_step());
    detail::SweepScope scope(s, "lr_find", {recorder});
    for (auto& group : s.optim.optimizers[0]->param_groups()) group.options().set_lr(options_.min_lr);
    s.limits.max_steps = scope.start_step() + options_.num_training;
    detail::run_sweep(scope, [&] { s.fit_loop.run(); });
    if (recorder->steps_taken != options_.num_training)
      s.info(fmt::format("LR finder stopped early after {} steps due to diverging loss.", recorder->steps_taken));
    result_.emplace(options_.mode, options_.min_lr, options_.max_lr, options_.num_training,
                    std::move(recorder->results));
    if (!attr.empty())
      if (const auto lr = result_->suggestion()) apply_suggestion(s, module, attr, *lr);
  }
  if (early_exit_) throw detail::TunerExit{};
}

}  // namespace fulgor
