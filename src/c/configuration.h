#pragma once

// The C API's configuration: the JSON object fulgor_model_create takes (its
// keys are listed in include/fulgor/c/fulgor.h), read as fulgor reads all
// outside JSON (Note [Reading outside JSON]) and checked key by key, each
// refusal a FULGOR_ERROR_CONFIG naming the key and what it accepts.

#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/optim/scheduler.h"

namespace fulgor::c_api {

struct Configuration {
  std::string accelerator = "auto";
  std::string precision = "32-true";
  std::string loss = "mse";  // a built-in loss's name, when loss_script is empty
  std::string loss_script;  // the TorchScript loss's path
  std::optional<uint64_t> seed;
  bool device_buffers = false;
  nlohmann::json optimizer = nlohmann::json::object();
  nlohmann::json lr_scheduler;  // null: none
  // FabricOptions' fields of the same names; unset: Fabric's defaults.
  std::optional<std::string> strategy;
  std::optional<std::string> sharding_strategy;
  std::optional<bool> zero_redundancy_optimizer;
  std::optional<std::string> state_dict_type;
  std::optional<double> ddp_timeout;
};

/// The configuration `text` gives (null: every default); a relative path in
/// it is taken from `folder` (empty: the working directory).
Configuration read_configuration(const char* text, const std::string& folder = "");

/// The configuration the file at `path` holds, its paths taken from its folder.
Configuration read_configuration_file(const char* path);

/// The optimizer "optimizer" describes, over `parameters`.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const nlohmann::json& config,
                                                        std::vector<torch::Tensor> parameters);

/// The schedule "lr_scheduler" describes, of `optimizer`.
std::unique_ptr<LRScheduler> make_scheduler(const nlohmann::json& config, torch::optim::Optimizer& optimizer);

}  // namespace fulgor::c_api
