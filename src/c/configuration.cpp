#include "c/configuration.h"

#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "c/failure.h"
#include "config/closest_name.h"
#include "config/json_input.h"
#include "detail/read_at.h"
#include "detail/regular_file.h"
#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"
#include "fulgor/optim/scheduler.h"

namespace fulgor::c_api {
namespace {

using nlohmann::json;

void check_keys(const json& object, const std::string& where, const std::vector<std::string>& known) {
  if (!object.is_object())
    fail(FULGOR_ERROR_CONFIG, fmt::format("{} is a {}; expected a JSON object", where, object.type_name()));
  for (const auto& item : object.items())
    if (std::find(known.begin(), known.end(), item.key()) == known.end())
      fail(FULGOR_ERROR_CONFIG, fmt::format("{}: {}", where, detail::unknown_name_message("key", item.key(), known)));
}

// The value of `key` as a string, a double, an int64_t or a uint64_t.
template <typename T>
const char* kind_of() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, uint64_t>) return "a non-negative integer";
  if constexpr (std::is_same_v<T, int64_t>) return "an integer";
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  return "a number";
}

template <typename T>
T value_at(const json& object, const std::string& key, const std::string& where, T fallback) {
  const auto it = object.find(key);
  if (it == object.end()) return fallback;
  bool fits = it->is_number();
  if constexpr (std::is_same_v<T, std::string>) fits = it->is_string();
  if constexpr (std::is_same_v<T, bool>) fits = it->is_boolean();
  if constexpr (std::is_same_v<T, uint64_t>) fits = it->is_number_unsigned();
  if constexpr (std::is_same_v<T, int64_t>)
    fits = it->is_number_integer() &&
           !(it->is_number_unsigned() && it->template get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
  if (!fits)
    fail(FULGOR_ERROR_CONFIG, fmt::format("{} key '{}' is {} ({}); expected {}", where, key,
                                          detail::json_for_message(*it), it->type_name(), kind_of<T>()));
  return it->template get<T>();
}

// torch's optimizers check these in their constructors with c10 errors; here
// they are the configuration's, named by their keys.
double non_negative(const json& object, const std::string& key, const std::string& where, double fallback) {
  const double value = value_at<double>(object, key, where, fallback);
  if (!(value >= 0))
    fail(FULGOR_ERROR_CONFIG, fmt::format("{} key '{}' is {}; expected a number >= 0", where, key, value));
  return value;
}

std::tuple<double, double> betas_of(const json& config, const std::string& where) {
  if (!config.contains("betas")) return {0.9, 0.999};
  const auto& b = config.at("betas");
  const auto in_range = [](const json& beta) { return beta.is_number() && beta >= 0 && beta < 1; };
  if (!b.is_array() || b.size() != 2 || !in_range(b[0]) || !in_range(b[1]))
    fail(FULGOR_ERROR_CONFIG,
         fmt::format("{} key 'betas' is {}; expected two numbers in [0, 1)", where, detail::json_for_message(b)));
  return {b[0].get<double>(), b[1].get<double>()};
}

// A configuration is a few kilobytes; a larger file is none.
constexpr uint64_t kMaxConfigBytes = 16 << 20;

// A name no accelerator has registered is the configuration's mistake; a
// registered one that is unavailable here is the device's (fulgor_c.cpp).
void check_accelerator(const std::string& name) {
  const auto& registry = AcceleratorRegistry::instance();
  if (name == "auto" || name == "gpu" || registry.contains(name)) return;
  std::vector<std::string> known = registry.names();
  known.insert(known.begin(), {"auto", "gpu"});
  fail(FULGOR_ERROR_CONFIG,
       "the configuration's \"accelerator\": " + detail::unknown_name_message("accelerator", name, known) +
           " (fulgor-info lists them, with their availability here)");
}

// "loss": a built-in's name, or {"type": "torchscript", "path": PATH}.
void read_loss(const json& config, const std::string& folder, Configuration& result) {
  const auto it = config.find("loss");
  if (it == config.end() || !it->is_object()) {
    result.loss = value_at<std::string>(config, "loss", "the configuration", result.loss);
    return;
  }
  const std::string where = "the configuration's \"loss\"";
  check_keys(*it, where, {"type", "path"});
  const auto type = value_at<std::string>(*it, "type", where, "");
  if (type != "torchscript")
    fail(FULGOR_ERROR_CONFIG, fmt::format("{}: {} (a built-in loss is given by its name alone, as \"loss\": \"mse\")",
                                          where, detail::unknown_name_message("type", type, {"torchscript"})));
  const auto path = value_at<std::string>(*it, "path", where, "");
  if (path.empty()) fail(FULGOR_ERROR_CONFIG, where + " of type torchscript needs \"path\", its TorchScript file");
  result.loss_script = folder.empty() || path.front() == '/' ? path : folder + "/" + path;
}

}  // namespace

Configuration read_configuration_file(const char* path) {
  if (path == nullptr) fail(FULGOR_ERROR_ARGUMENT, "config_path is a null pointer");
  // Note [Opening a user's path]: a FIFO is refused, not waited on.
  const detail::RegularFile file = detail::RegularFile::open(path);
  if (!file) fail(FULGOR_ERROR_CONFIG, fmt::format("the configuration file '{}' {}", path, file.problem()));
  if (file.size() > kMaxConfigBytes)
    fail(FULGOR_ERROR_CONFIG, fmt::format("the configuration file '{}' is larger than {} MiB: not a configuration",
                                          path, kMaxConfigBytes >> 20));
  std::string text(static_cast<size_t>(file.size()), '\0');
  if (!detail::read_at(file.fd(), 0, text.data(), text.size()))
    fail(FULGOR_ERROR_CONFIG, fmt::format("the configuration file '{}' cannot be read: {}", path,
                                          errno != 0 ? std::strerror(errno) : "it shrank"));
  const std::string folder = std::filesystem::path(path).parent_path().string();
  try {
    return read_configuration(text.c_str(), folder.empty() ? "." : folder);
  } catch (const Failure& f) {
    fail(f.status, fmt::format("'{}': {}", path, f.message));
  }
}

Configuration read_configuration(const char* text, const std::string& folder) {
  Configuration result;
  if (text == nullptr) return result;
  detail::JsonInput input = detail::read_json(text);
  if (input.not_json) fail(FULGOR_ERROR_CONFIG, "the configuration is not JSON: " + input.error);
  if (!input.error.empty()) fail(FULGOR_ERROR_CONFIG, "the configuration: " + input.error);
  const json& config = input.value;
  const std::string where = "the configuration";
  check_keys(config, where,
             {"accelerator", "precision", "loss", "optimizer", "lr_scheduler", "seed", "buffers", "strategy",
              "sharding_strategy", "zero_redundancy_optimizer", "state_dict_type", "ddp_timeout"});
  read_loss(config, folder, result);
  const auto buffers = value_at<std::string>(config, "buffers", where, "host");
  if (buffers != "host" && buffers != "device")
    fail(FULGOR_ERROR_CONFIG, fmt::format("{} key 'buffers' is '{}'; expected host or device", where, buffers));
  result.device_buffers = buffers == "device";
  if (config.contains("seed")) result.seed = value_at<uint64_t>(config, "seed", where, 0);
  result.accelerator = value_at<std::string>(config, "accelerator", where, result.accelerator);
  check_accelerator(result.accelerator);
  result.precision = value_at<std::string>(config, "precision", where, result.precision);
  if (config.contains("strategy")) result.strategy = value_at<std::string>(config, "strategy", where, "");
  if (config.contains("sharding_strategy"))
    result.sharding_strategy = value_at<std::string>(config, "sharding_strategy", where, "");
  // A TorchScript model holds no fulgor::Sharded unit for FULL_SHARD or
  // HYBRID_SHARD to shard. Fabric checks the names.
  std::string sharding = result.sharding_strategy.value_or("FULL_SHARD");
  std::transform(sharding.begin(), sharding.end(), sharding.begin(), [](unsigned char c) { return std::toupper(c); });
  if (result.strategy == "fsdp" && (sharding == "FULL_SHARD" || sharding == "HYBRID_SHARD"))
    fail(FULGOR_ERROR_CONFIG,
         fmt::format("{}: strategy \"fsdp\" takes sharding_strategy \"SHARD_GRAD_OP\" or \"NO_SHARD\" here; "
                     "{} shards the parameters of fulgor::Sharded units, which a TorchScript model has none of",
                     where, sharding == "FULL_SHARD" ? "FULL_SHARD (Lightning's default)" : "HYBRID_SHARD"));
  if (config.contains("zero_redundancy_optimizer"))
    result.zero_redundancy_optimizer = value_at<bool>(config, "zero_redundancy_optimizer", where, false);
  if (config.contains("state_dict_type"))
    result.state_dict_type = value_at<std::string>(config, "state_dict_type", where, "");
  if (config.contains("ddp_timeout")) {
    const double seconds = value_at<double>(config, "ddp_timeout", where, 0);
    if (!(seconds > 0 && std::isfinite(seconds)))
      fail(FULGOR_ERROR_CONFIG,
           fmt::format("{} key 'ddp_timeout' is {}; expected a finite number of seconds > 0", where, seconds));
    result.ddp_timeout = seconds;
  }
  if (config.contains("optimizer")) result.optimizer = config.at("optimizer");
  if (config.contains("lr_scheduler")) result.lr_scheduler = config.at("lr_scheduler");
  return result;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const json& config, std::vector<torch::Tensor> parameters) {
  const std::string where = "the configuration's \"optimizer\"";
  check_keys(config, where, {"type", "lr", "momentum", "weight_decay", "betas", "eps"});
  const auto type = value_at<std::string>(config, "type", where, "adam");
  if (type != "sgd" && type != "adam" && type != "adamw")
    fail(FULGOR_ERROR_CONFIG,
         fmt::format("{}: {}", where, detail::unknown_name_message("type", type, {"sgd", "adam", "adamw"})));
  const double lr = non_negative(config, "lr", where, type == "sgd" ? 0.01 : 0.001);
  const double weight_decay = non_negative(config, "weight_decay", where, type == "adamw" ? 0.01 : 0.0);
  if (type == "sgd") {
    if (config.contains("betas") || config.contains("eps"))
      fail(FULGOR_ERROR_CONFIG, where + ": \"betas\" and \"eps\" are Adam's; SGD takes lr, momentum, weight_decay");
    return std::make_unique<torch::optim::SGD>(
        parameters,
        torch::optim::SGDOptions(lr).momentum(non_negative(config, "momentum", where, 0.0)).weight_decay(weight_decay));
  }
  if (config.contains("momentum")) fail(FULGOR_ERROR_CONFIG, where + ": \"momentum\" is SGD's");
  const auto betas = betas_of(config, where);
  const double eps = non_negative(config, "eps", where, 1e-8);
  if (type == "adam")
    return std::make_unique<torch::optim::Adam>(
        parameters, torch::optim::AdamOptions(lr).betas(betas).eps(eps).weight_decay(weight_decay));
  return std::make_unique<torch::optim::AdamW>(
      parameters, torch::optim::AdamWOptions(lr).betas(betas).eps(eps).weight_decay(weight_decay));
}

std::unique_ptr<LRScheduler> make_scheduler(const json& config, torch::optim::Optimizer& optimizer) {
  const std::string where = "the configuration's \"lr_scheduler\"";
  check_keys(config, where, {"type", "step_size", "gamma", "T_max", "eta_min"});
  const auto type = value_at<std::string>(config, "type", where, "");
  try {
    if (type == "step") {
      check_keys(config, where + " of type step", {"type", "step_size", "gamma"});
      return std::make_unique<StepLR>(optimizer, value_at<int64_t>(config, "step_size", where, 1),
                                      value_at<double>(config, "gamma", where, 0.1));
    }
    if (type == "cosine") {
      check_keys(config, where + " of type cosine", {"type", "T_max", "eta_min"});
      if (!config.contains("T_max")) fail(FULGOR_ERROR_CONFIG, where + " of type cosine needs \"T_max\"");
      return std::make_unique<CosineAnnealingLR>(optimizer, value_at<int64_t>(config, "T_max", where, 1),
                                                 value_at<double>(config, "eta_min", where, 0.0));
    }
  } catch (const ConfigError& e) {
    fail(FULGOR_ERROR_CONFIG, fmt::format("{}: {}", where, e.what()));
  }
  fail(FULGOR_ERROR_CONFIG,
       fmt::format("{}: {}", where, detail::unknown_name_message("type", type, {"step", "cosine"})));
}

}  // namespace fulgor::c_api
