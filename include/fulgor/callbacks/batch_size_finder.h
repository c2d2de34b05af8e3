#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Options of the batch-size search (Lightning's scale_batch_size
/// arguments, with its defaults).
struct ScaleBatchSizeOptions {
  /// "power": double the size until it runs out of memory, then take the
  /// last that fit; "binsearch": then search between the last that fit and
  /// the first that did not.
  std::string mode = "power";
  int64_t steps_per_trial = 3;  ///< optimizer steps each size trains
  int64_t init_val = 2;         ///< the first size tried
  int64_t max_trials = 25;      ///< trials that fit before the search ends
  /// The hyper-parameter holding the batch size: a key of the module's
  /// hparams() or of the data module's (both are set where both have it).
  std::string batch_arg_name = "batch_size";
  /// binsearch: the size found is reduced by this fraction, as a safety
  /// margin (in [0, 1)).
  double margin = 0.05;
  int64_t max_val = 8192;  ///< sizes are capped here, and the search stops there
};

/// One trial of the search: the batch size and whether its steps fitted in
/// memory.
struct BatchSizeTrial {
  int64_t batch_size;
  bool fitted;
  bool operator==(const BatchSizeTrial& o) const { return batch_size == o.batch_size && fitted == o.fitted; }
};

/// Lightning's BatchSizeFinder: as the fit begins, trains steps_per_trial
/// steps at growing batch sizes until the accelerator runs out of memory
/// (Accelerator::is_out_of_memory, not a device name), following Lightning's
/// _run_power_scaling or _run_binsearch_scaling step for step, then puts the
/// weights, optimizer, schedulers, loop counters, callbacks' states and
/// generators back (Note [A sweep inside a fit] in src/tuner/sweep.h) and
/// leaves the size found in the batch-size hyper-parameter, from which the
/// module's or the data module's train_loader() makes its loader.
///
/// Contract: the fit's loaders must come from the module or a data module
/// that reads hparams()[batch_arg_name] (ConfigError for a loader given to
/// fit, for a missing hyper-parameter, and under ddp, as Lightning). A size
/// whose loader has at most one batch per epoch counts as the whole data
/// set, where the search stops growing (Lightning compares with the data
/// set's length). An exception that is not an out-of-memory error ends the
/// search and propagates, after the starting point is put back. Under
/// fast_dev_run it does nothing, with a warning.
class FULGOR_API BatchSizeFinder : public Callback {
 public:
  /// Throws ConfigError for a mode other than "power" or "binsearch" (either
  /// case), a margin outside [0, 1), or counts or sizes below 1.
  explicit BatchSizeFinder(ScaleBatchSizeOptions options = {});

  void on_fit_start(Trainer& trainer, ModuleBase& module) override;
  /// Runs the search now.
  void scale_batch_size(Trainer& trainer, ModuleBase& module);

  /// The size found (Lightning's optimal_batch_size): init_val before a
  /// search, nullopt when fast_dev_run skipped it.
  std::optional<int64_t> optimal_batch_size() const { return optimal_; }
  /// The last search's trials, in order.
  const std::vector<BatchSizeTrial>& trials() const { return trials_; }
  const ScaleBatchSizeOptions& options() const { return options_; }

 private:
  friend class Tuner;
  ScaleBatchSizeOptions options_;
  std::optional<int64_t> optimal_;
  std::vector<BatchSizeTrial> trials_;
  // Set by the Tuner: the fit ends once the search is over.
  bool early_exit_ = false;
};

}  // namespace fulgor
