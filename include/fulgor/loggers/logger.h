#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

/// Where the Trainer sends metrics and hyper-parameters (Lightning's Logger).
///
/// Contract: log_metrics receives the values logged since the last call, with
/// the global step; save() makes what was logged durable; finalize() is called
/// once when a loop ends. Throws Error naming the file when it cannot write.
class FULGOR_API Logger {
 public:
  virtual ~Logger() = default;
  virtual std::string name() const = 0;
  /// The run's version label, e.g. "version_3".
  virtual std::string version() const = 0;
  /// The run's folder, or "" for loggers that write no files.
  virtual std::string log_dir() const = 0;
  virtual void log_hyperparams(const nlohmann::json& hparams) = 0;
  virtual void log_metrics(const std::map<std::string, double>& metrics, int64_t step) = 0;
  virtual void save() {}
  /// `status` is "success", "failed" or "interrupted".
  virtual void finalize(const std::string& /*status*/) { save(); }
};

/// Options shared by the file loggers.
struct FULGOR_API FileLoggerOptions {
  std::string save_dir = ".";
  std::string name = "lightning_logs";
  /// The version number; unset means one more than the highest version_N in
  /// save_dir/name, chosen when the logger first writes.
  std::optional<int64_t> version;
  /// Rewrites the file after this many log_metrics calls (and on save/finalize).
  int64_t flush_logs_every_n_steps = 100;
};

namespace detail {
inline FileLoggerOptions in_dir(std::string save_dir) {
  FileLoggerOptions options;
  options.save_dir = std::move(save_dir);
  return options;
}

// Versioned run folders: save_dir/name/version_N, created on first use.
class VersionedDir {
 public:
  explicit VersionedDir(FileLoggerOptions options) : options_(std::move(options)) {}
  int64_t version() const;
  std::string path() const;
  // Creates the folder; throws Error naming it when it cannot.
  std::string create() const;
  const FileLoggerOptions& options() const { return options_; }

 private:
  FileLoggerOptions options_;
  mutable std::optional<int64_t> version_;
};
}  // namespace detail

/// What the file loggers share: the run folder `save_dir/name/version_N`
/// (created when first written to) and `hparams.json` in it.
class FULGOR_API FileLogger : public Logger {
 public:
  std::string name() const override { return dir_.options().name; }
  std::string version() const override;
  std::string log_dir() const override;
  /// N of version_N: gives another logger the same run folder.
  int64_t version_number() const;
  void log_hyperparams(const nlohmann::json& hparams) override;

 protected:
  explicit FileLogger(FileLoggerOptions options) : dir_(std::move(options)) {}
  detail::VersionedDir dir_;
};

/// Lightning's CSVLogger: `save_dir/name/version_N/metrics.csv`, one row per
/// log_metrics call with a column per metric name ever logged ("step" first),
/// and the hyper-parameters in `hparams.json` beside it.
class FULGOR_API CSVLogger : public FileLogger {
 public:
  explicit CSVLogger(FileLoggerOptions options = {});
  explicit CSVLogger(std::string save_dir) : CSVLogger(detail::in_dir(std::move(save_dir))) {}
  ~CSVLogger() override;
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  void save() override;

 private:
  std::vector<std::string> columns_;
  std::vector<std::map<std::string, double>> rows_;
  int64_t unsaved_ = 0;
};

/// Writes `save_dir/name/version_N/metrics.jsonl`: one JSON object per
/// log_metrics call ({"step": ..., "<metric>": ...}), appended as it comes, and
/// `hparams.json`.
class FULGOR_API JsonLinesLogger : public FileLogger {
 public:
  explicit JsonLinesLogger(FileLoggerOptions options = {});
  explicit JsonLinesLogger(std::string save_dir) : JsonLinesLogger(detail::in_dir(std::move(save_dir))) {}
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  void save() override;

 private:
  std::ofstream out_;
};

}  // namespace fulgor
