#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Options of ModelCheckpoint, with Lightning's names and defaults.
struct ModelCheckpointOptions {
  /// Folder of the checkpoints, made absolute (default: the Trainer's
  /// default_root_dir/checkpoints, set in setup).
  std::string dirpath;
  /// File name without ".ckpt": `{epoch}`, `{step}` and logged metric names,
  /// each with an optional Python format spec (`{epoch:02d}`, `{val_loss:.3f}`);
  /// a metric not logged is 0. With auto_insert_metric_name, each group is
  /// preceded by its name: "e{epoch:02d}" gives `eepoch=03`. Default
  /// "{epoch}-{step}".
  std::string filename;
  /// The metric that ranks checkpoints (empty: keep the latest).
  std::string monitor;
  /// "min" or "max": which monitored values are better.
  std::string mode = "min";
  /// How many checkpoints to keep: the k best (or latest), -1 all, 0 none.
  int64_t save_top_k = 1;
  /// Also write last.ckpt after each save of this callback (and at the end
  /// of training when it saved nothing), removing the previous one.
  bool save_last = false;
  /// Saves at the end of every N-th training epoch, or after its validation
  /// (see save_on_train_epoch_end); 0 never. Default 1 when neither
  /// every_n_train_steps nor train_time_interval is set, else 0.
  std::optional<int64_t> every_n_epochs;
  /// Saves after every N optimizer steps (0 or unset: never).
  std::optional<int64_t> every_n_train_steps;
  /// Saves after the first training batch that ends this long after the
  /// previous time-based save (or the start of training).
  std::optional<std::chrono::duration<double>> train_time_interval;
  /// Whether the epoch-based save happens at the end of the training epoch
  /// (true) or after validation (false). Unset: at the epoch's end when
  /// check_val_every_n_epoch is 1 and either val_check_interval is 1.0 or
  /// the fit does not validate, else after each validation run.
  std::optional<bool> save_on_train_epoch_end;
  bool auto_insert_metric_name = true;
  /// A file name that exists already (a `filename` without a changing
  /// metric) gets a version, `best-v1.ckpt`, `best-v2.ckpt`, ..., instead of
  /// being overwritten.
  bool enable_version_counter = true;
};

/// Saves checkpoints while fitting and keeps the best (Lightning's ModelCheckpoint).
///
/// Contract: decides as Lightning 2.6's ModelCheckpoint. While fitting (not
/// in the sanity check, nor under fast_dev_run, and at most once per optimizer
/// step) it saves every N epochs at the epoch's end or after validation (see
/// save_on_train_epoch_end), every N optimizer steps, or after a time
/// interval; keeps the save_top_k files best by `monitor` (a NaN is the worst
/// score), deleting the others it wrote in its folder; and with save_last
/// rewrites last.ckpt after each of its saves. Throws ConfigError at a save
/// when the monitored metric is missing once validation has run, listing the
/// metrics that were logged (before that, warns and skips the save). Its
/// bookkeeping is saved in checkpoints, so a resumed run keeps ranking the
/// earlier files. Its saves are asynchronous with the Trainer's
/// async_checkpointing (Trainer::save_checkpoint_async): the ranking
/// (best_model_path and the others) counts a file from the moment its save
/// begins, as the state inside the file must, and the file it displaces is
/// removed only once the new file is on disk.
class FULGOR_API ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options = {});

  std::string state_key() const override;
  bool saves_checkpoints() const override { return true; }
  bool monitors_metrics() const override { return true; }
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_train_start(Trainer& trainer, ModuleBase& module) override;
  void on_sanity_check_start(Trainer& trainer, ModuleBase& module) override;
  void on_validation_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor& loss, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, ModuleBase& module) override;
  void on_validation_end(Trainer& trainer, ModuleBase& module) override;
  void on_train_end(Trainer& trainer, ModuleBase& module) override;

  const std::string& dirpath() const { return dirpath_; }
  /// The best checkpoint (without a monitor: the latest top-k save).
  const std::string& best_model_path() const { return best_model_path_; }
  /// Its monitored score; empty without a monitor. A NaN score is kept as
  /// the mode's worst value (+inf for "min", -inf for "max").
  std::optional<double> best_model_score() const { return best_model_score_; }
  const std::string& last_model_path() const { return last_model_path_; }
  /// The kept checkpoints and their monitored scores; empty without a monitor.
  const std::map<std::string, double>& best_k_models() const { return best_k_models_; }
  /// The worst of the kept checkpoints, the one the next better score
  /// replaces, and its score; set once save_top_k files are kept (before
  /// that, "" and the mode's worst value).
  const std::string& kth_best_model_path() const { return kth_best_model_path_; }
  double kth_value() const { return kth_value_; }
  /// The file name `filename` gives with these metrics, without the folder,
  /// version and ".ckpt". Throws ConfigError when a format spec does not fit
  /// its value (`{val_loss:d}`).
  std::string format_checkpoint_name(const std::map<std::string, double>& metrics) const;

  /// Lightning's CHECKPOINT_NAME_LAST: the name of save_last's file, and how
  /// ckpt_path "last" knows a last checkpoint (a name beginning with it).
  static constexpr const char* kCheckpointNameLast = "last";

 private:
  static constexpr int64_t kStartingVersion = 1;

  using Clock = std::chrono::steady_clock;

  bool should_skip_saving_checkpoint(const Trainer& trainer) const;
  bool should_save_on_train_epoch_end(const Trainer& trainer) const;
  void save_on_epoch(Trainer& trainer);
  void save_topk_checkpoint(Trainer& trainer, const std::map<std::string, double>& candidates);
  void save_last_checkpoint(Trainer& trainer);
  bool check_monitor_top_k(Trainer& trainer, double current) const;
  void update_best_and_save(double current, Trainer& trainer, const std::map<std::string, double>& candidates);
  void save_none_monitor_checkpoint(Trainer& trainer, const std::map<std::string, double>& candidates);
  void save_checkpoint(Trainer& trainer, const std::string& filepath, const std::string& displaced = {});
  bool should_remove_checkpoint(const std::string& previous, const std::string& current) const;
  void remove_checkpoint(Trainer& trainer, const std::string& filepath) const;
  void remove_orphans(Trainer& trainer) const;
  std::string checkpoint_path(const std::string& name, std::optional<int64_t> version = std::nullopt) const;
  std::string metric_interpolated_filepath(const std::map<std::string, double>& candidates, Trainer& trainer,
                                           const std::string& del_filepath) const;
  bool file_exists(const std::string& filepath, Trainer& trainer) const;
  std::map<std::string, double> monitor_candidates(const Trainer& trainer) const;
  double worst_score() const;
  bool better(double a, double b) const;

  ModelCheckpointOptions options_;
  int64_t every_n_epochs_ = 0, every_n_train_steps_ = 0;
  std::string dirpath_;
  std::map<std::string, double> best_k_models_;
  std::string kth_best_model_path_;
  double kth_value_;
  std::optional<double> best_model_score_, current_score_;
  std::string best_model_path_, last_model_path_;
  // Lightning starts at 0: nothing is saved before the first optimizer step.
  int64_t last_global_step_saved_ = 0;
  std::string last_checkpoint_saved_;
  // A state loaded before setup resolved the default folder.
  std::optional<nlohmann::json> pending_state_;
  // The file this callback is writing, named in the state it writes into it
  // (Note [Orphaned checkpoint files]).
  std::string saving_;
  // A state of this folder was loaded: the fit removes its orphans once it
  // starts training.
  bool remove_orphans_ = false;
  std::optional<Clock::time_point> last_time_checked_;
  // A step- or time-based save waiting for validation to log the monitor.
  bool defer_save_until_validation_ = false;
  // Note [When ModelCheckpoint saves] in model_checkpoint.cpp.
  bool fit_validates_ = false;
  bool validation_has_run_ = false;
  bool warned_missing_monitor_ = false;
};

}  // namespace fulgor
