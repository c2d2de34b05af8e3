#include "fulgor/config/trainer_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>

#include "fulgor/core/error.h"
#include "fulgor/config/seed.h"
#include "config/closest_name.h"
#include "config/json_input.h"
#include "config/option_names.h"

namespace fulgor {
namespace {

// nlohmann reads 2^63 and above as unsigned, which get<int64_t> wraps.
int64_t int64_of(const nlohmann::json& json) {
  if (json.is_number_unsigned() && json.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw ConfigError(fmt::format("{} is out of range: expected an integer up to {}", json.get<uint64_t>(), INT64_MAX));
  return json.get<int64_t>();
}

}  // namespace

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
  if (std::isfinite(fraction_) && s.find_first_of(".e") == std::string::npos) s += ".0";
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
    limit = Limit(int64_of(json));
  else if (json.is_number_float())
    limit = Limit(json.get<double>());
  else
    throw ConfigError(fmt::format("expected a batch count (integer) or fraction (number with a decimal point), got {}",
                                  detail::json_for_message(json)));
}

void to_json(nlohmann::json& json, const Devices& devices) {
  std::visit([&](const auto& v) { json = v; }, devices.value());
}

void from_json(const nlohmann::json& json, Devices& devices) {
  if (json.is_number_integer()) {
    devices = Devices(int64_of(json));
  } else if (json.is_string()) {
    devices = Devices(json.get<std::string>());
  } else if (json.is_array() &&
             std::all_of(json.begin(), json.end(), [](const auto& e) { return e.is_number_integer(); })) {
    std::vector<int64_t> indices;
    for (const auto& index : json) indices.push_back(int64_of(index));
    devices = Devices(std::move(indices));
  } else {
    throw ConfigError(fmt::format("expected devices as an integer, a string or a list of integers, got {}",
                                  detail::json_for_message(json)));
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
  throw ConfigError(
      fmt::format("trainer option '{}': expected {}, got {}", key, type, detail::json_for_message(value)));
}

int64_t int64_option(const char* key, const json& value) {
  try {
    return int64_of(value);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("trainer option '{}': {}", key, e.what()));
  }
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
      o.*member = int64_option(name, value);
    } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      if (value.is_null()) {
        o.*member = std::nullopt;
        return;
      }
      if (!value.is_number_integer()) ill_typed(name, type, value);
      o.*member = int64_option(name, value);
    } else if constexpr (std::is_same_v<T, std::optional<uint64_t>>) {
      if (value.is_null()) {
        o.*member = std::nullopt;
        return;
      }
      // The seed, the one such option: Lightning's range (seed.h).
      if (!value.is_number_unsigned() || value.get<uint64_t>() > kMaxSeed) ill_typed(name, type, value);
      o.*member = value.get<uint64_t>();
    } else if constexpr (std::is_same_v<T, std::optional<bool>>) {
      if (value.is_null()) {
        o.*member = std::nullopt;
        return;
      }
      if (!value.is_boolean()) ill_typed(name, type, value);
      o.*member = value.get<bool>();
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
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("trainer option '{}': {}", name, e.what()));
      }
    }
  };
  return {name, type, get, set};
}

// Lightning accepts the precision as a number too (32).
Field precision_field() {
  return {"precision", "a string (or the integer 32)", [](const TrainerOptions& o) { return json(o.precision); },
          [](TrainerOptions& o, const json& v) {
            if (v.is_string())
              o.precision = v.get<std::string>();
            else if (v.is_number_integer())
              o.precision = std::to_string(int64_option("precision", v));
            else
              ill_typed("precision", "a string (or the integer 32)", v);
          }};
}

// Lightning accepts a boolean or a number of batches.
Field fast_dev_run_field() {
  return {"fast_dev_run", "a boolean or an integer", [](const TrainerOptions& o) { return json(o.fast_dev_run); },
          [](TrainerOptions& o, const json& v) {
            if (v.is_boolean())
              o.fast_dev_run = v.get<bool>() ? 1 : 0;
            else if (v.is_number_integer())
              o.fast_dev_run = int64_option("fast_dev_run", v);
            else
              ill_typed("fast_dev_run", "a boolean or an integer", v);
          }};
}

const std::vector<Field>& fields() {
  static const std::vector<Field> all = [] {
    std::vector<Field> f;
    f.push_back(field("accelerator", "a string", &TrainerOptions::accelerator));
    f.push_back(field("strategy", "a string", &TrainerOptions::strategy));
    f.push_back(field("devices", "devices (an integer, a string like \"0,1\" or a list of integers)",
                      &TrainerOptions::devices));
    f.push_back(field("num_nodes", "an integer", &TrainerOptions::num_nodes));
    f.push_back(precision_field());
    f.push_back(field("logger", "a boolean", &TrainerOptions::logger));
    f.push_back(fast_dev_run_field());
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
    f.push_back(field("reload_dataloaders_every_n_epochs", "an integer",
                      &TrainerOptions::reload_dataloaders_every_n_epochs));
    f.push_back(field("num_sanity_val_steps", "an integer", &TrainerOptions::num_sanity_val_steps));
    f.push_back(field("log_every_n_steps", "an integer", &TrainerOptions::log_every_n_steps));
    f.push_back(field("enable_checkpointing", "a boolean", &TrainerOptions::enable_checkpointing));
    f.push_back(field("async_checkpointing", "a boolean", &TrainerOptions::async_checkpointing));
    f.push_back(field("enable_progress_bar", "a boolean", &TrainerOptions::enable_progress_bar));
    f.push_back(field("enable_model_summary", "a boolean", &TrainerOptions::enable_model_summary));
    f.push_back(field("accumulate_grad_batches", "an integer", &TrainerOptions::accumulate_grad_batches));
    f.push_back(field("gradient_clip_val", "a number or null", &TrainerOptions::gradient_clip_val));
    f.push_back(field("gradient_clip_algorithm", "a string", &TrainerOptions::gradient_clip_algorithm));
    f.push_back(field("deterministic", "a boolean", &TrainerOptions::deterministic));
    f.push_back(field("detect_anomaly", "a boolean", &TrainerOptions::detect_anomaly));
    f.push_back(field("benchmark", "a boolean or null", &TrainerOptions::benchmark));
    f.push_back(field("inference_mode", "a boolean", &TrainerOptions::inference_mode));
    f.push_back(field("barebones", "a boolean", &TrainerOptions::barebones));
    f.push_back(field("sync_batchnorm", "a boolean", &TrainerOptions::sync_batchnorm));
    f.push_back(field("profiler", "a string", &TrainerOptions::profiler));
    f.push_back(field("profiler_dirpath", "a string", &TrainerOptions::profiler_dirpath));
    f.push_back(field("profiler_filename", "a string", &TrainerOptions::profiler_filename));
    f.push_back(field("default_root_dir", "a string", &TrainerOptions::default_root_dir));
    f.push_back(field("seed", "a non-negative integer up to 4294967295 or null", &TrainerOptions::seed));
    f.push_back(field("ddp_timeout", "a number of seconds or null", &TrainerOptions::ddp_timeout));
    f.push_back(field("use_distributed_sampler", "a boolean", &TrainerOptions::use_distributed_sampler));
    f.push_back(field("sharding_strategy", "a string", &TrainerOptions::sharding_strategy));
    f.push_back(field("zero_redundancy_optimizer", "a boolean", &TrainerOptions::zero_redundancy_optimizer));
    f.push_back(field("state_dict_type", "a string", &TrainerOptions::state_dict_type));
    return f;
  }();
  return all;
}

const Field& find_field(const std::string& key) {
  for (const auto& f : fields())
    if (key == f.name) return f;
  throw ConfigError(detail::unknown_name_message("trainer option", key, trainer_option_names()));
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

bool parse_unsigned(const std::string& text, uint64_t& out) {
  if (text.empty() || text.front() == '-') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  out = v;
  return true;
}

// Digits, with a sign or not: an integer however large.
bool is_integer_text(const std::string& text) {
  const size_t digits = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  return text.size() > digits && std::all_of(text.begin() + static_cast<std::ptrdiff_t>(digits), text.end(),
                                             [](unsigned char c) { return std::isdigit(c); });
}

bool parse_number(const std::string& text, double& out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  // Too small a number reads as 0 or a denormal, as in JSON; too large a one is refused.
  if ((errno == ERANGE && std::isinf(v)) || *end != '\0') return false;
  out = v;
  return true;
}

void check_limit(const Limit& limit, const char* name) {
  // Written so that NaN fails too.
  if (limit.is_count() ? limit.count() < 0 : !(limit.fraction() >= 0 && limit.fraction() <= 1))
    throw ConfigError(fmt::format("{}={}: expected a batch count >= 0 or a fraction in [0.0, 1.0]", name, limit.str()));
}

// Lightning's refusals under barebones of the features it does not turn
// off itself (its "opt-ins"), with its words.
void check_barebones_options(const TrainerOptions& o) {
  auto refuse = [](const std::string& passed, const char* why) {
    throw ConfigError(fmt::format("`Trainer(barebones=True, {})` was passed. {} so it is disabled in barebones mode.",
                                  passed, why));
  };
  if (o.fast_dev_run != 0)
    refuse(fmt::format("fast_dev_run={}", o.fast_dev_run), "Development run is not meant for raw speed evaluation");
  if (o.detect_anomaly) refuse("detect_anomaly=True", "Anomaly detection can impact raw speed");
  if (!o.profiler.empty()) refuse(fmt::format("profiler='{}'", o.profiler), "Profiling can impact raw speed");
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
      detail::JsonInput parsed = detail::read_json(text);
      if (!parsed.not_json && !parsed.error.empty())
        throw ConfigError(fmt::format("trainer option '{}': {}", f.name, parsed.error));
      if (parsed.error.empty()) return std::move(parsed.value);
    }
    return text;
  }
  if (parse_integer(text, i)) {
    if (type.rfind("a non-negative", 0) == 0 && i >= 0) return static_cast<uint64_t>(i);
    return i;
  }
  if (uint64_t u = 0; parse_unsigned(text, u)) return u;  // 2^63 to 2^64 - 1: the option says whether it takes it
  if (type.find("integer") != std::string::npos && is_integer_text(text))
    throw ConfigError(fmt::format("trainer option '{}': {} is out of range: expected {}", f.name, text, f.type));
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
  if (!json.is_object())
    throw ConfigError(fmt::format("trainer options must be a JSON object, got {}", detail::json_for_message(json)));
  for (const auto& item : json.items()) find_field(item.key()).set(options, item.value());
}

void check_options(const TrainerOptions& o) {
  detail::check_strategy(o.strategy);
  detail::check_sharding(o.strategy, o.sharding_strategy, o.zero_redundancy_optimizer);
  detail::check_state_dict_type(o.state_dict_type);
  auto at_least = [](int64_t value, int64_t min, const char* name) {
    if (value < min) throw ConfigError(fmt::format("{}={}: expected an integer >= {}", name, value, min));
  };
  if (o.max_epochs) at_least(*o.max_epochs, -1, "max_epochs");
  if (o.min_epochs) at_least(*o.min_epochs, 0, "min_epochs");
  if (o.min_steps) at_least(*o.min_steps, 0, "min_steps");
  at_least(o.max_steps, -1, "max_steps");
  at_least(o.fast_dev_run, 0, "fast_dev_run");
  at_least(o.num_sanity_val_steps, -1, "num_sanity_val_steps");
  at_least(o.log_every_n_steps, 1, "log_every_n_steps");
  at_least(o.accumulate_grad_batches, 1, "accumulate_grad_batches");
  at_least(o.num_nodes, 1, "num_nodes");
  at_least(o.reload_dataloaders_every_n_epochs, 0, "reload_dataloaders_every_n_epochs");
  if (o.check_val_every_n_epoch) at_least(*o.check_val_every_n_epoch, 1, "check_val_every_n_epoch");
  check_limit(o.limit_train_batches, "limit_train_batches");
  check_limit(o.limit_val_batches, "limit_val_batches");
  check_limit(o.limit_test_batches, "limit_test_batches");
  check_limit(o.limit_predict_batches, "limit_predict_batches");
  check_limit(o.overfit_batches, "overfit_batches");
  check_limit(o.val_check_interval, "val_check_interval");
  if (o.val_check_interval.is_count() ? o.val_check_interval.count() < 1 : o.val_check_interval.fraction() <= 0)
    throw ConfigError(fmt::format("val_check_interval={}: expected a batch count >= 1 or a fraction in (0.0, 1.0]",
                                  o.val_check_interval.str()));
  if (o.gradient_clip_algorithm != "norm" && o.gradient_clip_algorithm != "value")
    throw ConfigError(
        fmt::format("unknown gradient_clip_algorithm '{}'; known: norm, value", o.gradient_clip_algorithm));
  if (o.gradient_clip_val && !(std::isfinite(*o.gradient_clip_val) && *o.gradient_clip_val >= 0))
    throw ConfigError(fmt::format("gradient_clip_val={}: expected a finite number >= 0", *o.gradient_clip_val));
  // Lightning's "advanced" (cProfile), "pytorch" (torch.profiler) and "xla"
  // profilers have no counterpart here.
  if (!o.profiler.empty() && !detail::names_simple_profiler(o.profiler))
    throw ConfigError(fmt::format(
        "unknown profiler '{}'; known: \"\" (off), simple (Lightning's advanced, pytorch and xla are not offered)",
        o.profiler));
  if (o.ddp_timeout && !(std::isfinite(*o.ddp_timeout) && *o.ddp_timeout > 0))
    throw ConfigError(fmt::format("ddp_timeout={}: expected a finite number of seconds > 0", *o.ddp_timeout));
  if (o.seed) check_seed(*o.seed, "seed");
  if (o.barebones) check_barebones_options(o);
}

void set_option(TrainerOptions& options, const std::string& key, const std::string& value) {
  const Field& f = find_field(key);
  // Strings end up in JSON (hyper-parameters, checkpoints), which must be UTF-8.
  if (!detail::is_valid_utf8(value))
    throw ConfigError(
        fmt::format("trainer option '{}': the value {} is not valid UTF-8", key, detail::json_for_message(value)));
  f.set(options, text_to_json(f, value));
}

}  // namespace fulgor

namespace fulgor::detail {

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = {"auto", "ddp", "fsdp", "single_device"};
  return names;
}

std::string sharding_strategy_name(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
  static const std::vector<std::string> known = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};
  if (std::find(known.begin(), known.end(), name) == known.end())
    throw ConfigError(fmt::format("unknown sharding_strategy '{}'; known: {}", name, fmt::join(known, ", ")));
  return name;
}

void check_sharding(const std::string& strategy, const std::string& sharding_strategy, bool zero_redundancy_optimizer) {
  const bool fsdp = strategy == "fsdp";
  if (fsdp) sharding_strategy_name(sharding_strategy);
  if (zero_redundancy_optimizer && strategy != "ddp" && strategy != "auto")
    throw ConfigError(
        fmt::format("zero_redundancy_optimizer=true shards the optimizers' state under strategy \"ddp\", not \"{}\"{}",
                    strategy, fsdp ? " (fsdp shards it already)" : ""));
}

void check_state_dict_type(const std::string& state_dict_type) {
  if (state_dict_type != "full" && state_dict_type != "sharded")
    throw ConfigError(
        fmt::format("state_dict_type='{}': expected \"full\" (one checkpoint file, the state whole) "
                    "or \"sharded\" (a distributed checkpoint's folder, each rank's part)",
                    state_dict_type));
}

void check_strategy(const std::string& strategy) {
  const auto& names = strategy_names();
  if (std::find(names.begin(), names.end(), strategy) == names.end())
    throw ConfigError(fmt::format("unknown strategy '{}'; known strategies: {}", strategy, fmt::join(names, ", ")));
}

bool names_simple_profiler(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name == "simple";
}

}  // namespace fulgor::detail
