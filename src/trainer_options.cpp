#include "fulgor/trainer_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>

#include "fulgor/error.h"

namespace fulgor {

std::optional<int64_t> Limit::of(std::optional<int64_t> total) const {
  if (count_) return total ? std::min(*count_, *total) : *count_;
  if (total) return static_cast<int64_t>(std::floor(static_cast<double>(*total) * fraction_));
  if (fraction_ == 0.0) return 0;
  return std::nullopt;
}

std::string Limit::str() const {
  if (count_) return std::to_string(*count_);
  std::string s = fmt::format("{}", fraction_);
  // A fraction keeps a decimal point so that reading it back gives a fraction.
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

void to_json(nlohmann::json& json, const Limit& limit) {
  if (limit.is_count())
    json = limit.count();
  else
    json = limit.fraction();
}

void from_json(const nlohmann::json& json, Limit& limit) {
  if (json.is_number_integer())
    limit = Limit(json.get<int64_t>());
  else if (json.is_number_float())
    limit = Limit(json.get<double>());
  else
    throw ConfigError(
        fmt::format("expected a batch count (integer) or fraction (number with a decimal point), got {}", json.dump()));
}

void to_json(nlohmann::json& json, const Devices& devices) {
  std::visit([&](const auto& v) { json = v; }, devices.value());
}

void from_json(const nlohmann::json& json, Devices& devices) {
  if (json.is_number_integer()) {
    devices = Devices(json.get<int64_t>());
  } else if (json.is_string()) {
    devices = Devices(json.get<std::string>());
  } else if (json.is_array() &&
             std::all_of(json.begin(), json.end(), [](const auto& e) { return e.is_number_integer(); })) {
    devices = Devices(json.get<std::vector<int64_t>>());
  } else {
    throw ConfigError(
        fmt::format("expected devices as an integer, a string or a list of integers, got {}", json.dump()));
  }
}

namespace {

using nlohmann::json;

// One option: its name, the type a user must give, and how it converts.
struct Field {
  const char* name;
  const char* type;
  std::function<json(const TrainerOptions&)> get;
  std::function<void(TrainerOptions&, const json&)> set;
};

[[noreturn]] void ill_typed(const char* key, const char* type, const json& value) {
  throw ConfigError(fmt::format("trainer option '{}': expected {}, got {}", key, type, value.dump()));
}

template <typename T>
json value_json(const T& v) {
  return json(v);
}
template <typename T>
json value_json(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

template <typename T>
Field field(const char* name, const char* type, T TrainerOptions::*member) {
  auto get = [member](const TrainerOptions& o) { return value_json(o.*member); };
  auto set = [name, type, member](TrainerOptions& o, const json& value) {
    if constexpr (std::is_same_v<T, std::string>) {
      if (!value.is_string()) ill_typed(name, type, value);
      o.*member = value.get<std::string>();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!value.is_boolean()) ill_typed(name, type, value);
      o.*member = value.get<bool>();
    } else if constexpr (std::is_same_v<T, int64_t>) {
      if (!value.is_number_integer()) ill_typed(name, type, value);
      o.*member = value.get<int64_t>();
    } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      if (value.is_null()) {
        o.*member = std::nullopt;
        return;
      }
      if (!value.is_number_integer()) ill_typed(name, type, value);
      o.*member = value.get<int64_t>();
    } else if constexpr (std::is_same_v<T, std::optional<uint64_t>>) {
      if (value.is_null()) {
        o.*member = std::nullopt;
        return;
      }
      if (!value.is_number_unsigned()) ill_typed(name, type, value);
      o.*member = value.get<uint64_t>();
    } else if constexpr (std::is_same_v<T, std::optional<double>>) {
      if (value.is_null()) {
        o.*member = std::nullopt;
        return;
      }
      if (!value.is_number()) ill_typed(name, type, value);
      o.*member = value.get<double>();
    } else {
      try {
        o.*member = value.get<T>();
      } catch (const ConfigError&) {
        ill_typed(name, type, value);
      }
    }
  };
  return {name, type, get, set};
}

const std::vector<Field>& fields() {
  static const std::vector<Field> all = [] {
    std::vector<Field> f;
    f.push_back(field("accelerator", "a string", &TrainerOptions::accelerator));
    f.push_back(field("strategy", "a string", &TrainerOptions::strategy));
    f.push_back(field("devices", "devices (an integer, a string like \"0,1\" or a list of integers)",
                      &TrainerOptions::devices));
    // Lightning accepts the precision as a number too (32).
    f.push_back({"precision", "a string (or the integer 32)", [](const TrainerOptions& o) { return json(o.precision); },
                 [](TrainerOptions& o, const json& v) {
                   if (v.is_string())
                     o.precision = v.get<std::string>();
                   else if (v.is_number_integer())
                     o.precision = std::to_string(v.get<int64_t>());
                   else
                     ill_typed("precision", "a string (or the integer 32)", v);
                 }});
    f.push_back(field("logger", "a boolean", &TrainerOptions::logger));
    // Lightning accepts a boolean or a number of batches.
    f.push_back({"fast_dev_run", "a boolean or an integer",
                 [](const TrainerOptions& o) { return json(o.fast_dev_run); },
                 [](TrainerOptions& o, const json& v) {
                   if (v.is_boolean())
                     o.fast_dev_run = v.get<bool>() ? 1 : 0;
                   else if (v.is_number_integer())
                     o.fast_dev_run = v.get<int64_t>();
                   else
                     ill_typed("fast_dev_run", "a boolean or an integer", v);
                 }});
    auto opt_int = [](const char* name, std::optional<int64_t> TrainerOptions::*m) {
      return field(name, "an integer or null", m);
    };
    f.push_back(opt_int("max_epochs", &TrainerOptions::max_epochs));
    f.push_back(opt_int("min_epochs", &TrainerOptions::min_epochs));
    f.push_back(field("max_steps", "an integer", &TrainerOptions::max_steps));
    f.push_back(opt_int("min_steps", &TrainerOptions::min_steps));
    const char* limit = "a batch count (integer) or fraction (number with a decimal point)";
    f.push_back(field("limit_train_batches", limit, &TrainerOptions::limit_train_batches));
    f.push_back(field("limit_val_batches", limit, &TrainerOptions::limit_val_batches));
    f.push_back(field("limit_test_batches", limit, &TrainerOptions::limit_test_batches));
    f.push_back(field("limit_predict_batches", limit, &TrainerOptions::limit_predict_batches));
    f.push_back(field("overfit_batches", limit, &TrainerOptions::overfit_batches));
    f.push_back(field("val_check_interval", limit, &TrainerOptions::val_check_interval));
    f.push_back(opt_int("check_val_every_n_epoch", &TrainerOptions::check_val_every_n_epoch));
    f.push_back(field("num_sanity_val_steps", "an integer", &TrainerOptions::num_sanity_val_steps));
    f.push_back(field("log_every_n_steps", "an integer", &TrainerOptions::log_every_n_steps));
    f.push_back(field("enable_checkpointing", "a boolean", &TrainerOptions::enable_checkpointing));
    f.push_back(field("enable_progress_bar", "a boolean", &TrainerOptions::enable_progress_bar));
    f.push_back(field("enable_model_summary", "a boolean", &TrainerOptions::enable_model_summary));
    f.push_back(field("accumulate_grad_batches", "an integer", &TrainerOptions::accumulate_grad_batches));
    f.push_back(field("gradient_clip_val", "a number or null", &TrainerOptions::gradient_clip_val));
    f.push_back(field("gradient_clip_algorithm", "a string", &TrainerOptions::gradient_clip_algorithm));
    f.push_back(field("deterministic", "a boolean", &TrainerOptions::deterministic));
    f.push_back(field("detect_anomaly", "a boolean", &TrainerOptions::detect_anomaly));
    f.push_back(field("profiler", "a string", &TrainerOptions::profiler));
    f.push_back(field("profiler_dirpath", "a string", &TrainerOptions::profiler_dirpath));
    f.push_back(field("profiler_filename", "a string", &TrainerOptions::profiler_filename));
    f.push_back(field("default_root_dir", "a string", &TrainerOptions::default_root_dir));
    f.push_back(field("seed", "a non-negative integer or null", &TrainerOptions::seed));
    f.push_back(field("ddp_timeout", "a number of seconds or null", &TrainerOptions::ddp_timeout));
    return f;
  }();
  return all;
}

const Field& find_field(const std::string& key) {
  for (const auto& f : fields())
    if (key == f.name) return f;
  throw ConfigError(
      fmt::format("unknown trainer option '{}'; known options: {}", key, fmt::join(trainer_option_names(), ", ")));
}

bool parse_integer(const std::string& text, int64_t& out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  out = v;
  return true;
}

bool parse_number(const std::string& text, double& out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0') return false;
  out = v;
  return true;
}

// The JSON value a command-line text stands for, guided by the option's type:
// numbers and booleans for the options that take them, strings otherwise.
json text_to_json(const Field& f, const std::string& text) {
  const std::string type = f.type;
  int64_t i = 0;
  double d = 0;
  if ((text == "null" || text == "None" || text == "none") && type.find("null") != std::string::npos) return nullptr;
  if (type == "a string") return text;
  if (type == "a boolean" || type.rfind("a boolean or", 0) == 0) {
    if (text == "true" || text == "True") return true;
    if (text == "false" || text == "False") return false;
  }
  if (type.rfind("devices", 0) == 0) {
    if (parse_integer(text, i)) return i;
    if (!text.empty() && text.front() == '[') {
      json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded()) return parsed;
    }
    return text;
  }
  if (parse_integer(text, i)) {
    if (type.rfind("a non-negative", 0) == 0 && i >= 0) return static_cast<uint64_t>(i);
    return i;
  }
  if (parse_number(text, d)) return d;
  if (type.rfind("a string", 0) == 0) return text;
  // Not a number, boolean or null: hand over as a string so the message names it.
  return text;
}

}  // namespace

std::vector<std::string> trainer_option_names() {
  std::vector<std::string> names;
  for (const auto& f : fields()) names.emplace_back(f.name);
  return names;
}

void to_json(nlohmann::json& json, const TrainerOptions& options) {
  json = nlohmann::json::object();
  for (const auto& f : fields()) json[f.name] = f.get(options);
}

void from_json(const nlohmann::json& json, TrainerOptions& options) {
  if (!json.is_object()) throw ConfigError(fmt::format("trainer options must be a JSON object, got {}", json.dump()));
  for (const auto& item : json.items()) find_field(item.key()).set(options, item.value());
}

void set_option(TrainerOptions& options, const std::string& key, const std::string& value) {
  const Field& f = find_field(key);
  f.set(options, text_to_json(f, value));
}

}  // namespace fulgor
