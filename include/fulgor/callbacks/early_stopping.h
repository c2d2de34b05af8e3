#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Why EarlyStopping asked to stop (Lightning's EarlyStoppingReason, with its values).
enum class EarlyStoppingReason {
  not_stopped = 0,
  stopping_threshold = 1,    ///< the metric got better than stopping_threshold
  divergence_threshold = 2,  ///< the metric got worse than divergence_threshold
  patience_exhausted = 3,    ///< `patience` checks without improvement
  non_finite_metric = 4,     ///< the metric was NaN or infinite (check_finite)
};

/// Options of EarlyStopping, with Lightning's names and defaults.
struct EarlyStoppingOptions {
  std::string monitor;
  /// The change that counts as an improvement: the metric must beat the best
  /// by more than this in the mode's direction. A negative value lets a
  /// slightly worse metric count as an improvement, as in Lightning.
  double min_delta = 0.0;
  /// Checks without improvement before stopping.
  int64_t patience = 3;
  std::string mode = "min";  ///< "min" or "max"
  /// Stop when the metric is NaN or infinite.
  bool check_finite = true;
  /// Stop as soon as the metric is better than this.
  std::optional<double> stopping_threshold;
  /// Stop as soon as the metric is worse than this.
  std::optional<double> divergence_threshold;
  /// Throw ConfigError when the metric is missing (otherwise skip the check).
  bool strict = true;
  /// Print each improvement and the reason when stopping.
  bool verbose = false;
  /// Check at the end of each training epoch (true) or after each validation
  /// run (false). Unset: at the epoch's end when val_check_interval is 1.0 and
  /// check_val_every_n_epoch is 1, else after validation (Lightning's rule),
  /// resolved at setup; EarlyStopping::check_on_train_epoch_end() tells which.
  std::optional<bool> check_on_train_epoch_end;
  /// In a ddp job, print (verbose) on rank 0 only; otherwise every rank
  /// prints, naming itself.
  bool log_rank_zero_only = false;
};

/// Stops fitting when a monitored metric stops improving (Lightning's EarlyStopping).
///
/// Contract: checks at the end of each training epoch or after each
/// validation run, as check_on_train_epoch_end() says (never in the sanity
/// check, nor outside fit, nor under fast_dev_run); in that order, a
/// non-finite metric, the stopping threshold, the divergence threshold and
/// `patience` checks without improvement ask the Trainer to stop, with
/// Lightning's message (stopping_reason_message(), also the fit's message)
/// and stopping_reason(). A missing metric throws ConfigError naming the
/// logged ones when strict. check_on_train_epoch_end() is the option when it
/// is set; when it is not, setup resolves it as Lightning's does, to
/// val_check_interval == 1.0 (or a count of 1) and check_val_every_n_epoch
/// == 1, once: a later fit under other intervals keeps the first answer.
class FULGOR_API EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options);

  std::string state_key() const override;
  bool monitors_metrics() const override { return true; }
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_validation_end(Trainer& trainer, ModuleBase& module) override;
  void on_train_epoch_end(Trainer& trainer, ModuleBase& module) override;

  int64_t wait_count() const { return wait_count_; }
  /// The epoch at which it asked to stop (0: never).
  int64_t stopped_epoch() const { return stopped_epoch_; }
  double best_score() const { return best_score_; }
  EarlyStoppingReason stopping_reason() const { return stopping_reason_; }
  /// Why it asked to stop, in Lightning's words ("" before).
  const std::string& stopping_reason_message() const { return stopping_reason_message_; }
  /// Whether it checks at the end of each training epoch (true) or after each
  /// validation run (false), as resolved (see the contract); nullopt while the
  /// option is unset and no setup has run.
  std::optional<bool> check_on_train_epoch_end() const { return options_.check_on_train_epoch_end; }

 private:
  bool should_skip_check(const Trainer& trainer) const;
  bool validate_condition_metric(const std::map<std::string, double>& logs) const;
  void check(Trainer& trainer);
  std::pair<bool, std::string> evaluate_stopping_criteria(double current);
  void log_info(const Trainer& trainer, const std::string& message) const;

  EarlyStoppingOptions options_;
  double min_delta_;
  double best_score_;
  int64_t wait_count_ = 0;
  int64_t stopped_epoch_ = 0;
  EarlyStoppingReason stopping_reason_ = EarlyStoppingReason::not_stopped;
  std::string stopping_reason_message_;
};

}  // namespace fulgor
