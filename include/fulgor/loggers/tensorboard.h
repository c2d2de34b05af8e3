#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "fulgor/core/export.h"
#include "fulgor/loggers/logger.h"

namespace fulgor {

struct FULGOR_API TensorBoardLoggerOptions {
  std::string save_dir = ".";
  std::string name = "lightning_logs";
  /// The version number; unset means one more than the highest version_N in
  /// save_dir/name, chosen when the logger first writes.
  std::optional<int64_t> version;
  /// Events wait in memory and are written once an event comes this many
  /// seconds after the last write (torch's SummaryWriter default), and on
  /// save() and finalize().
  double flush_secs = 120;
  /// Logs `hp_metric` = -1 with the hyper-parameters, so that TensorBoard's
  /// HPARAMS tab lists the run (Lightning's default_hp_metric).
  bool default_hp_metric = true;
  /// Put before every metric name, joined with "-".
  std::string prefix;
};

/// Lightning's TensorBoardLogger: TensorBoard event files,
/// `save_dir/name/version_N/events.out.tfevents.<time>.<host>.<pid>.<n>`,
/// as torch.utils.tensorboard's SummaryWriter writes them: a "brain.Event:2"
/// event first, then one event per logged value (a Summary with the tag and
/// `simple_value`, at the given step). The hyper-parameters go in as the
/// `hparams` plugin's summaries, and into `hparams.yaml` beside the events.
///
/// Contract: what was logged is in the file after save(), finalize() or the
/// destructor, and at most flush_secs after it was logged when more comes.
/// Throws Error naming the file when it cannot write.
class FULGOR_API TensorBoardLogger : public FileLogger {
 public:
  explicit TensorBoardLogger(TensorBoardLoggerOptions options = {});
  explicit TensorBoardLogger(std::string save_dir);
  ~TensorBoardLogger() override;

  /// Nested objects are flattened to "a/b" names; values other than numbers,
  /// booleans and strings are written as text. Logs `hp_metric` = -1 unless
  /// default_hp_metric is false.
  void log_hyperparams(const nlohmann::json& hparams) override;
  /// With the metrics the HPARAMS tab shows for the run, logged at `step`.
  void log_hyperparams(const nlohmann::json& hparams, const std::map<std::string, double>& metrics, int64_t step = 0);
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  void save() override;
  void finalize(const std::string& status) override;

  /// The event file, "" until the first event.
  const std::string& event_file() const { return path_; }

 private:
  std::string tag(const std::string& name) const;
  void open_events();
  void write_event(const std::string& event);
  void flush();

  TensorBoardLoggerOptions tb_options_;
  nlohmann::json hparams_ = nlohmann::json::object();
  std::string path_;
  std::ofstream out_;
  std::string pending_;
  std::chrono::steady_clock::time_point last_write_;
};

}  // namespace fulgor
