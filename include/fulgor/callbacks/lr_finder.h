#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Options of the learning-rate range test (Lightning's lr_find arguments,
/// with its defaults).
struct FULGOR_API LrFindOptions {
  double min_lr = 1e-8;  ///< the rate of the first step
  double max_lr = 1.0;   ///< the rate of the last step
  /// Optimizer steps the sweep takes (Lightning's num_training): one rate each.
  int64_t num_training = 100;
  /// How the rate rises from step to step: "exponential" or "linear".
  std::string mode = "exponential";
  /// The sweep stops once the smoothed loss exceeds this many times the best
  /// smoothed loss so far (nullopt: never).
  std::optional<double> early_stop_threshold = 4.0;
  /// Whether to write the suggested rate into the module's hyper-parameter
  /// and the optimizer's parameter groups once the sweep is over.
  bool update_attr = true;
  /// The hyper-parameter (a key of ModuleBase::hparams()) holding the rate;
  /// empty: "lr", else "learning_rate", whichever the module has.
  std::string attr_name;
};

/// What a learning-rate sweep recorded (Lightning's _LRFinder): the rate of
/// each step and the smoothed loss it gave.
///
/// Contract: results().lr and results().loss have one entry per optimizer
/// step the sweep took (fewer than num_training when the loss diverged; a
/// step whose training_step returned no loss has NaN). suggestion() is
/// Lightning's: the rate where the loss falls fastest, by torch.gradient of
/// the losses over the rates (in float32, as Lightning's tensors), leaving
/// out the first skip_begin and the last skip_end entries (Python's slice
/// [skip_begin:-skip_end]) and the losses that are not finite.
class FULGOR_API LRFinder {
 public:
  struct Results {
    std::vector<double> lr;
    std::vector<double> loss;
  };

  LRFinder(std::string mode, double min_lr, double max_lr, int64_t num_training, Results results);

  const std::string& mode() const { return mode_; }
  double min_lr() const { return min_lr_; }
  double max_lr() const { return max_lr_; }
  int64_t num_training() const { return num_training_; }
  const Results& results() const { return results_; }

  /// The suggested rate; nullopt when fewer than two finite losses remain.
  std::optional<double> suggestion(int64_t skip_begin = 10, int64_t skip_end = 1) const;
  /// The index into results() of the suggested rate (Lightning's _optimal_idx).
  std::optional<size_t> optimal_index(int64_t skip_begin = 10, int64_t skip_end = 1) const;

 private:
  std::string mode_;
  double min_lr_, max_lr_;
  int64_t num_training_;
  Results results_;
};

/// Lightning's LearningRateFinder: a learning-rate range test as the fit
/// begins. It trains num_training optimizer steps with the rate rising from
/// min_lr to max_lr (Lightning's _ExponentialLR or _LinearLR: the first step
/// at min_lr, step k >= 1 at min_lr * (max_lr/min_lr)^((k+1)/num_training),
/// or min_lr + (k+1)/num_training * (max_lr - min_lr)), records each step's
/// loss smoothed as Lightning does (an exponential average with beta 0.98,
/// divided by 1 - beta^(n+1) after the sweep's n-th step, n from 1), stops
/// early when it diverges, and then puts everything back (Note [A sweep inside a fit] in
/// src/tuner/sweep.h): weights, optimizer, schedulers, loop counters,
/// callbacks' states and random generators are as before the sweep, bit for
/// bit. With update_attr it then sets the suggested rate (Note [Applying the
/// suggestion] in src/tuner/lr_finder.cpp).
///
/// Contract: the sweep runs the Trainer's fit loop with this callback's
/// recorder as its only callback, no loggers and no scheduler of the
/// module's; it validates as the Trainer's options say. It needs automatic
/// optimization and one optimizer (ConfigError otherwise); with update_attr,
/// the module's hparams() must hold the rate under attr_name, or "lr" or
/// "learning_rate" (ConfigError otherwise). Under fast_dev_run it does
/// nothing, with a warning. lr_find() may be called from on_train_epoch_start
/// too (a subclass running a sweep at chosen epochs, as Lightning's
/// FineTuneLearningRateFinder example).
class FULGOR_API LearningRateFinder : public Callback {
 public:
  /// Throws ConfigError for a mode other than "exponential" or "linear"
  /// (either case), num_training < 1, or rates that are not positive.
  explicit LearningRateFinder(LrFindOptions options = {});

  void on_fit_start(Trainer& trainer, ModuleBase& module) override;
  /// Runs the sweep now.
  void lr_find(Trainer& trainer, ModuleBase& module);

  /// The last sweep's record (Lightning's optimal_lr); nullopt before one
  /// ran, or when fast_dev_run skipped it.
  const std::optional<LRFinder>& result() const { return result_; }
  const LrFindOptions& options() const { return options_; }

 private:
  friend class Tuner;
  LrFindOptions options_;
  std::optional<LRFinder> result_;
  // Set by the Tuner: the fit ends once the sweep is over.
  bool early_exit_ = false;
};

}  // namespace fulgor
