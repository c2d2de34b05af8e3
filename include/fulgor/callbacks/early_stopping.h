#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "fulgor/callback.h"

namespace fulgor {

/// Options of EarlyStopping, with Lightning's names and defaults.
struct EarlyStoppingOptions {
  std::string monitor;
  /// The smallest change that counts as an improvement.
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
  /// Print the reason when stopping.
  bool verbose = false;
  /// Check at the end of each training epoch (true) or after each validation
  /// run (false). Unset: at the epoch's end when val_check_interval is 1.0 and
  /// check_val_every_n_epoch is 1, else after validation (Lightning's rule).
  std::optional<bool> check_on_train_epoch_end;
};

/// Stops fitting when a monitored metric stops improving (Lightning's EarlyStopping).
///
/// Contract: checks at the end of each training epoch or after each
/// validation run, as check_on_train_epoch_end says (never in the sanity
/// check, nor outside fit, nor under fast_dev_run); asks the Trainer to stop with a reason
/// (also in reason()) naming the metric and the rule that fired.
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options);

  std::string state_key() const override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_validation_end(Trainer& trainer, ModuleBase& module) override;
  void on_train_epoch_end(Trainer& trainer, ModuleBase& module) override;

  int64_t wait_count() const { return wait_; }
  /// The epoch at which it asked to stop (0: never).
  int64_t stopped_epoch() const { return stopped_epoch_; }
  double best_score() const { return best_; }
  const std::string& reason() const { return reason_; }

 private:
  bool should_skip_check(const Trainer& trainer) const;
  bool validate_condition_metric(const std::map<std::string, double>& logs) const;
  void check(Trainer& trainer);

  EarlyStoppingOptions options_;
  double best_;
  int64_t wait_ = 0;
  int64_t stopped_epoch_ = 0;
  std::string reason_;
};

}  // namespace fulgor
