#include "fulgor/loggers/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <regex>
#include <utility>
#include <vector>

#include "fulgor/core/error.h"
#include "loggers/protobuf.h"
#include "loggers/tfrecord.h"

namespace fulgor {
namespace fs = std::filesystem;

namespace {

using detail::proto::Message;

// Note [TensorBoard event fields]
// Field numbers come from TensorBoard's protos: Event, Summary and
// SummaryMetadata (tensorboard/compat/proto/event.proto, summary.proto), and
// the hparams plugin's HParamsPluginData, SessionStartInfo, SessionEndInfo
// (plugins/hparams/plugin_data.proto), Experiment, HParamInfo, MetricInfo,
// MetricName (plugins/hparams/api.proto) and google.protobuf.Value
// (struct.proto). proto3 leaves fields at their default out, so the step of an
// event at step 0 and the plugin data's version (0) are not written; values of
// a oneof (simple_value, number_value) are written even when zero.
enum EventField : uint32_t { kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5 };
enum SummaryValueField : uint32_t { kTag = 1, kSimpleValue = 2, kMetadata = 9 };
enum DataType : uint64_t { kDataTypeString = 1, kDataTypeFloat64 = 3 };
constexpr uint64_t kStatusSuccess = 1;

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Message event_at(int64_t step) {
  Message event;
  event.double_field(kWallTime, wall_time());
  if (step != 0) event.varint_field(kStep, static_cast<uint64_t>(step));
  return event;
}

std::string scalar_event(const std::string& tag, double value, int64_t step) {
  Message summary_value;
  summary_value.bytes_field(kTag, tag).float_field(kSimpleValue, static_cast<float>(value));
  Message summary;
  summary.message_field(1, summary_value);
  return event_at(step).message_field(kSummary, summary).data();
}

// A summary the hparams plugin reads: `content` is a HParamsPluginData whose
// field `data_field` holds `data`.
std::string hparams_event(const std::string& tag, uint32_t data_field, const Message& data, int64_t step) {
  Message content;
  content.message_field(data_field, data);
  Message plugin_data;
  plugin_data.bytes_field(1, "hparams").message_field(2, content);
  Message metadata;
  metadata.message_field(1, plugin_data);
  Message summary_value;
  summary_value.bytes_field(kTag, tag).message_field(kMetadata, metadata);
  Message summary;
  summary.message_field(1, summary_value);
  return event_at(step).message_field(kSummary, summary).data();
}

// Lightning's _flatten_dict: nested objects, and lists of objects, become
// "a/b" and "a/0/b" names.
void flatten(const nlohmann::json& value, const std::string& key,
             std::vector<std::pair<std::string, nlohmann::json>>& out) {
  auto child = [&](const std::string& name) { return key.empty() ? name : key + "/" + name; };
  if (value.is_object()) {
    for (const auto& [name, item] : value.items()) flatten(item, child(name), out);
  } else if (value.is_array() &&
             std::all_of(value.begin(), value.end(), [](const nlohmann::json& v) { return v.is_object(); })) {
    for (size_t i = 0; i < value.size(); ++i) flatten(value[i], child(std::to_string(i)), out);
  } else {
    out.emplace_back(key, value);
  }
}

// ---- hparams.yaml -------------------------------------------------------------

// YAML 1.1 (PyYAML) reads a number without a point as an integer or a string,
// so floats keep one: 1e-05 is written 1.0e-05, as yaml.dump does.
std::string yaml_float(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  std::string s = fmt::format("{}", v);
  if (s.find('.') == std::string::npos) {
    const auto e = s.find('e');
    s.insert(e == std::string::npos ? s.size() : e, ".0");
  }
  return s;
}

std::string yaml_scalar(const nlohmann::json& v) {
  if (v.is_number_float()) return yaml_float(v.get<double>());
  if (!v.is_string()) return v.dump();  // null, booleans, integers, and flow-style containers
  static const std::regex plain("[A-Za-z_][A-Za-z0-9_./-]*");
  static const std::regex keyword("y|n|yes|no|true|false|on|off|null", std::regex::icase);
  const auto& s = v.get_ref<const std::string&>();
  if (std::regex_match(s, plain) && !std::regex_match(s, keyword)) return s;
  return v.dump();  // double-quoted, with JSON's escapes, which YAML shares
}

void yaml_mapping(const nlohmann::json& object, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  for (const auto& [key, value] : object.items()) {
    out += pad + yaml_scalar(key) + ":";
    if (value.is_object() && !value.empty()) {
      out += "\n";
      yaml_mapping(value, indent + 2, out);
    } else if (value.is_array() && !value.empty()) {
      out += "\n";
      for (const auto& item : value) out += pad + "- " + yaml_scalar(item) + "\n";
    } else {
      out += " " + yaml_scalar(value) + "\n";
    }
  }
}

std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

}  // namespace

namespace {
FileLoggerOptions folder_of(const TensorBoardLoggerOptions& tensorboard) {
  FileLoggerOptions options;
  options.save_dir = tensorboard.save_dir;
  options.name = tensorboard.name;
  options.version = tensorboard.version;
  return options;
}

TensorBoardLoggerOptions in_dir(std::string save_dir) {
  TensorBoardLoggerOptions options;
  options.save_dir = std::move(save_dir);
  return options;
}
}  // namespace

TensorBoardLogger::TensorBoardLogger(TensorBoardLoggerOptions options)
    : FileLogger(folder_of(options)), tb_options_(std::move(options)) {}

TensorBoardLogger::TensorBoardLogger(std::string save_dir) : TensorBoardLogger(in_dir(std::move(save_dir))) {}

TensorBoardLogger::~TensorBoardLogger() {
  try {
    flush();
  } catch (const Error&) {
    // A destructor cannot report the failure; save() and finalize() do.
  }
}

void TensorBoardLogger::log_hyperparams(const nlohmann::json& hparams) {
  std::map<std::string, double> metrics;
  if (tb_options_.default_hp_metric) metrics["hp_metric"] = -1;
  log_hyperparams(hparams, metrics);
}

void TensorBoardLogger::log_hyperparams(const nlohmann::json& hparams, const std::map<std::string, double>& metrics,
                                        int64_t step) {
  if (!hparams.is_object())
    throw ConfigError(
        fmt::format("hyper-parameters must be a JSON object of names and values, got {}", hparams.dump()));
  hparams_.update(hparams);
  std::string yaml;
  if (hparams_.empty())
    yaml = "{}\n";
  else
    yaml_mapping(hparams_, 0, yaml);
  const std::string yaml_path = (fs::path(dir_.create()) / "hparams.yaml").string();
  std::ofstream yaml_file(yaml_path, std::ios::trunc);
  yaml_file << yaml;
  yaml_file.flush();
  if (!yaml_file) throw Error(fmt::format("cannot write '{}': {}", yaml_path, std::strerror(errno)));

  // As Lightning: without metrics the HPARAMS tab has nothing to show, and
  // nothing is written.
  if (metrics.empty()) return;
  log_metrics(metrics, step);

  // torch.utils.tensorboard.summary.hparams: numbers (booleans too, as
  // Python's bool is an int) and strings; Lightning makes anything else text.
  std::vector<std::pair<std::string, nlohmann::json>> flat;
  flatten(hparams, "", flat);
  Message start, experiment;
  for (const auto& [name, value] : flat) {
    Message v;
    DataType type = kDataTypeFloat64;
    if (value.is_number() || value.is_boolean()) {
      v.double_field(2, value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>());
    } else {
      v.bytes_field(3, value.is_string() ? value.get<std::string>() : value.is_null() ? "None" : value.dump());
      type = kDataTypeString;
    }
    Message entry;
    entry.bytes_field(1, name).message_field(2, v);
    start.message_field(1, entry);
    Message info;
    info.bytes_field(1, name).varint_field(4, type);
    experiment.message_field(4, info);
  }
  for (const auto& metric : metrics) {
    Message metric_name;
    metric_name.bytes_field(2, tag(metric.first));
    Message info;
    info.message_field(1, metric_name);
    experiment.message_field(5, info);
  }
  Message end;
  end.varint_field(1, kStatusSuccess);
  write_event(hparams_event("_hparams_/experiment", 2, experiment, step));
  write_event(hparams_event("_hparams_/session_start_info", 3, start, step));
  write_event(hparams_event("_hparams_/session_end_info", 4, end, step));
}

void TensorBoardLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  open_events();  // before the events take their wall time
  for (const auto& [name, value] : metrics) write_event(scalar_event(tag(name), value, step));
}

void TensorBoardLogger::save() { flush(); }

std::string TensorBoardLogger::tag(const std::string& name) const {
  return tb_options_.prefix.empty() ? name : tb_options_.prefix + "-" + name;
}

void TensorBoardLogger::finalize(const std::string& /*status*/) {
  // As SummaryWriter.close(): what comes later goes into a new file.
  flush();
  if (out_.is_open()) out_.close();
}

void TensorBoardLogger::write_event(const std::string& event) {
  open_events();
  pending_ += detail::tfrecord(event);
  const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_write_).count();
  if (since >= tb_options_.flush_secs) flush();
}

void TensorBoardLogger::open_events() {
  if (!out_.is_open()) {
    // One number per file this process opens, as torch's _global_uid.
    static std::atomic<int64_t> files{0};
    path_ = (fs::path(dir_.create()) / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}",
                                                   static_cast<int64_t>(std::time(nullptr)), hostname(),
                                                   static_cast<int64_t>(getpid()), files++))
                .string();
    out_.open(path_, std::ios::binary | std::ios::trunc);
    if (!out_) throw Error(fmt::format("cannot open '{}': {}", path_, std::strerror(errno)));
    // The file version goes in at once, as torch's EventFileWriter does.
    Message version = event_at(0);
    version.bytes_field(kFileVersion, "brain.Event:2");
    pending_ = detail::tfrecord(version.data());
    flush();
  }
}

void TensorBoardLogger::flush() {
  if (pending_.empty() || !out_.is_open()) return;
  out_.write(pending_.data(), static_cast<std::streamsize>(pending_.size()));
  out_.flush();
  if (!out_) throw Error(fmt::format("cannot write '{}': {}", path_, std::strerror(errno)));
  pending_.clear();
  last_write_ = std::chrono::steady_clock::now();
}

}  // namespace fulgor
