#include "fulgor/loggers/logger.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>

#include "fulgor/core/error.h"

namespace fulgor {
namespace fs = std::filesystem;

namespace detail {

int64_t VersionedDir::version() const {
  if (options_.version) return *options_.version;
  if (!version_) {
    // One more than the highest version_N already there.
    int64_t next = 0;
    std::error_code ec;
    static const std::regex name("version_(\\d+)");
    for (const auto& entry : fs::directory_iterator(fs::path(options_.save_dir) / options_.name, ec)) {
      std::smatch m;
      const std::string file = entry.path().filename().string();
      if (entry.is_directory() && std::regex_match(file, m, name)) next = std::max<int64_t>(next, std::stoll(m[1]) + 1);
    }
    version_ = next;
  }
  return *version_;
}

std::string VersionedDir::path() const {
  return (fs::path(options_.save_dir) / options_.name / ("version_" + std::to_string(version()))).string();
}

std::string VersionedDir::create() const {
  const std::string dir = path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create the log folder '{}': {}", dir, ec.message()));
  return dir;
}

namespace {
void write_hparams(const std::string& dir, const nlohmann::json& hparams) {
  const std::string path = (fs::path(dir) / "hparams.json").string();
  std::ofstream out(path);
  out << hparams.dump(2) << "\n";
  if (!out) throw Error(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
}

std::string csv_number(double v) {
  // Round-trip precision, as Python's repr writes floats.
  return fmt::format("{}", v);
}
}  // namespace
}  // namespace detail

// ---- FileLogger ---------------------------------------------------------------

std::string FileLogger::version() const { return "version_" + std::to_string(dir_.version()); }

std::string FileLogger::log_dir() const { return dir_.path(); }

int64_t FileLogger::version_number() const { return dir_.version(); }

void FileLogger::log_hyperparams(const nlohmann::json& hparams) { detail::write_hparams(dir_.create(), hparams); }

// ---- CSVLogger ----------------------------------------------------------------

CSVLogger::CSVLogger(FileLoggerOptions options) : FileLogger(std::move(options)) {}

CSVLogger::~CSVLogger() {
  try {
    if (unsaved_ > 0) save();
  } catch (const Error&) {
    // A destructor cannot report the failure; finalize() and save() do.
  }
}

void CSVLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  auto row = metrics;
  row["step"] = static_cast<double>(step);
  for (const auto& [k, v] : row)
    if (std::find(columns_.begin(), columns_.end(), k) == columns_.end()) columns_.push_back(k);
  rows_.push_back(std::move(row));
  if (++unsaved_ >= dir_.options().flush_logs_every_n_steps) save();
}

void CSVLogger::save() {
  // The whole file is rewritten because a new metric adds a column.
  const std::string path = (fs::path(dir_.create()) / "metrics.csv").string();
  std::vector<std::string> columns = columns_;
  std::sort(columns.begin(), columns.end());
  auto step = std::find(columns.begin(), columns.end(), "step");
  if (step != columns.end()) std::rotate(columns.begin(), step, step + 1);
  std::ofstream out(path, std::ios::trunc);
  for (size_t i = 0; i < columns.size(); ++i) out << (i ? "," : "") << columns[i];
  out << "\n";
  for (const auto& row : rows_) {
    for (size_t i = 0; i < columns.size(); ++i) {
      if (i) out << ",";
      auto it = row.find(columns[i]);
      if (it == row.end()) continue;
      if (columns[i] == "step" || columns[i] == "epoch")
        out << static_cast<int64_t>(it->second);
      else
        out << detail::csv_number(it->second);
    }
    out << "\n";
  }
  out.flush();
  if (!out) throw Error(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  unsaved_ = 0;
}

// ---- JsonLinesLogger ----------------------------------------------------------

JsonLinesLogger::JsonLinesLogger(FileLoggerOptions options) : FileLogger(std::move(options)) {}

void JsonLinesLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  if (!out_.is_open()) {
    const std::string path = (fs::path(dir_.create()) / "metrics.jsonl").string();
    out_.open(path, std::ios::app);
    if (!out_) throw Error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  }
  nlohmann::json line = {{"step", step}};
  for (const auto& [k, v] : metrics) {
    if (k == "epoch")
      line[k] = static_cast<int64_t>(v);
    else
      line[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(fmt::format("{}", v));
  }
  out_ << line.dump() << "\n";
}

void JsonLinesLogger::save() {
  if (out_.is_open()) out_.flush();
}

}  // namespace fulgor
