#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "fulgor/callback.h"

namespace fulgor {

/// Options of ModelCheckpoint, with Lightning's names and defaults.
struct ModelCheckpointOptions {
  /// Folder of the checkpoints (default: the Trainer's default_root_dir/checkpoints).
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
  /// Also write last.ckpt on every save.
  bool save_last = false;
  /// Saves at the end of every N-th training epoch (default 1, unless
  /// every_n_train_steps is set).
  std::optional<int64_t> every_n_epochs;
  /// Saves after every N optimizer steps.
  std::optional<int64_t> every_n_train_steps;
  bool auto_insert_metric_name = true;
  /// A file name that exists already (a `filename` without a changing
  /// metric) gets a version, `best-v1.ckpt`, `best-v2.ckpt`, ..., instead of
  /// being overwritten.
  bool enable_version_counter = true;
};

/// Saves checkpoints while fitting and keeps the best (Lightning's ModelCheckpoint).
///
/// Contract: saves at the end of training epochs (after validation) and/or
/// every N optimizer steps; keeps save_top_k files ranked by `monitor`
/// (deleting the others it wrote), and writes last.ckpt when save_last. Throws
/// ConfigError at a save when the monitored metric was never logged, listing
/// the metrics that were. Its bookkeeping is saved in checkpoints, so a resumed
/// run keeps ranking the earlier files.
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options = {});

  std::string state_key() const override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_train_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor& loss, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, ModuleBase& module) override;

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

 private:
  static constexpr int64_t kStartingVersion = 1;

  void save(Trainer& trainer);
  bool check_monitor_top_k(Trainer& trainer, double current) const;
  void update_best_and_save(double current, Trainer& trainer, const std::map<std::string, double>& candidates);
  void save_none_monitor_checkpoint(Trainer& trainer, const std::map<std::string, double>& candidates);
  void save_checkpoint(Trainer& trainer, const std::string& filepath);
  bool should_remove_checkpoint(const std::string& previous, const std::string& current) const;
  void remove_checkpoint(Trainer& trainer, const std::string& filepath) const;
  std::string checkpoint_path(const std::string& name, std::optional<int64_t> version = std::nullopt) const;
  std::string metric_interpolated_filepath(const std::map<std::string, double>& candidates, Trainer& trainer,
                                           const std::string& del_filepath) const;
  bool file_exists(const std::string& filepath, Trainer& trainer) const;
  std::map<std::string, double> monitor_candidates(const Trainer& trainer) const;
  double worst_score() const;
  bool better(double a, double b) const;

  ModelCheckpointOptions options_;
  std::string dirpath_;
  std::map<std::string, double> best_k_models_;
  std::string kth_best_model_path_;
  double kth_value_;
  std::optional<double> best_model_score_, current_score_;
  std::string best_model_path_, last_model_path_;
  // Lightning starts at 0: nothing is saved before the first optimizer step.
  int64_t last_global_step_saved_ = 0;
};

}  // namespace fulgor
