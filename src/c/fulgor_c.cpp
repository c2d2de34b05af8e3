// The C API (include/fulgor/c/fulgor.h): a TorchScriptModule trained by a
// Fabric, behind opaque handles and status codes.

#include "fulgor/c/fulgor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "fulgor/config/seed.h"
#include "fulgor/core/error.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/fabric/fabric.h"
#include "fulgor/jit/torchscript_module.h"
#include "fulgor/optim/scheduler.h"

struct fulgor_model {
  std::unique_ptr<fulgor::Fabric> fabric;
  std::unique_ptr<fulgor::TorchScriptModule> module;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<fulgor::LRScheduler> scheduler;
  std::string loss;
  bool device_buffers = false;
  int64_t steps = 0;
};

namespace {

thread_local std::string last_error;

// What a call failed with: its status and message.
struct Failure {
  fulgor_status status;
  std::string message;
};

[[noreturn]] void fail(fulgor_status status, std::string message) { throw Failure{status, std::move(message)}; }

// Runs `body`, turning every exception into a status and a message: none
// crosses into the caller's language.
template <typename Body>
fulgor_status guarded(const char* function, Body&& body) {
  try {
    body();
    return FULGOR_OK;
  } catch (const Failure& f) {
    last_error = fmt::format("{}: {}", function, f.message);
    return f.status;
  } catch (const fulgor::DeviceError& e) {
    last_error = fmt::format("{}: {}", function, e.what());
    return FULGOR_ERROR_DEVICE;
  } catch (const fulgor::CheckpointError& e) {
    last_error = fmt::format("{}: {}", function, e.what());
    return FULGOR_ERROR_CHECKPOINT;
  } catch (const fulgor::ConfigError& e) {
    last_error = fmt::format("{}: {}", function, e.what());
    return FULGOR_ERROR_CONFIG;
  } catch (const c10::Error& e) {
    last_error = fmt::format("{}: {}", function, e.what_without_backtrace());
    return FULGOR_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    last_error = fmt::format("{}: {}", function, e.what());
    return FULGOR_ERROR_INTERNAL;
  } catch (...) {
    last_error = fmt::format("{}: an unknown exception", function);
    return FULGOR_ERROR_INTERNAL;
  }
}

// ---- The configuration ------------------------------------------------------

void check_keys(const nlohmann::json& object, const std::string& where, const std::vector<std::string>& known) {
  if (!object.is_object())
    fail(FULGOR_ERROR_CONFIG, fmt::format("{} is a {}; expected a JSON object", where, object.type_name()));
  for (auto it = object.begin(); it != object.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      fail(FULGOR_ERROR_CONFIG,
           fmt::format("unknown key '{}' in {}; known keys: {}", it.key(), where, fmt::join(known, ", ")));
}

template <typename T>
T value_at(const nlohmann::json& object, const std::string& key, const std::string& where, T fallback) {
  const auto it = object.find(key);
  if (it == object.end()) return fallback;
  const bool fits = std::is_same_v<T, std::string> ? it->is_string()
                    : std::is_same_v<T, bool>      ? it->is_boolean()
                    : std::is_integral_v<T>        ? it->is_number_integer()
                                                   : it->is_number();
  if (!fits)
    fail(FULGOR_ERROR_CONFIG,
         fmt::format("{} key '{}' is {} ({}); expected {}", where, key, it->dump(), it->type_name(),
                     std::is_same_v<T, std::string> ? "a string"
                     : std::is_same_v<T, bool>      ? "a boolean"
                     : std::is_integral_v<T>        ? "an integer"
                                                    : "a number"));
  return it->get<T>();
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const nlohmann::json& config,
                                                        std::vector<torch::Tensor> parameters) {
  const std::string where = "the configuration's \"optimizer\"";
  check_keys(config, where, {"type", "lr", "momentum", "weight_decay", "betas", "eps"});
  const auto type = value_at<std::string>(config, "type", where, "adam");
  const double lr = value_at<double>(config, "lr", where, type == "sgd" ? 0.01 : 0.001);
  const double weight_decay = value_at<double>(config, "weight_decay", where, type == "adamw" ? 0.01 : 0.0);
  if (type == "sgd") {
    if (config.contains("betas") || config.contains("eps"))
      fail(FULGOR_ERROR_CONFIG, where + ": \"betas\" and \"eps\" are Adam's; SGD takes lr, momentum, weight_decay");
    return std::make_unique<torch::optim::SGD>(parameters,
                                               torch::optim::SGDOptions(lr)
                                                   .momentum(value_at<double>(config, "momentum", where, 0.0))
                                                   .weight_decay(weight_decay));
  }
  if (type != "adam" && type != "adamw")
    fail(FULGOR_ERROR_CONFIG, fmt::format("{} type '{}' is unknown; known types: sgd, adam, adamw", where, type));
  if (config.contains("momentum")) fail(FULGOR_ERROR_CONFIG, where + ": \"momentum\" is SGD's");
  std::tuple<double, double> betas{0.9, 0.999};
  if (config.contains("betas")) {
    const auto& b = config.at("betas");
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
      fail(FULGOR_ERROR_CONFIG, fmt::format("{} key 'betas' is {}; expected two numbers", where, b.dump()));
    betas = {b[0].get<double>(), b[1].get<double>()};
  }
  const double eps = value_at<double>(config, "eps", where, 1e-8);
  if (type == "adam")
    return std::make_unique<torch::optim::Adam>(
        parameters, torch::optim::AdamOptions(lr).betas(betas).eps(eps).weight_decay(weight_decay));
  return std::make_unique<torch::optim::AdamW>(
      parameters, torch::optim::AdamWOptions(lr).betas(betas).eps(eps).weight_decay(weight_decay));
}

std::unique_ptr<fulgor::LRScheduler> make_scheduler(const nlohmann::json& config, torch::optim::Optimizer& optimizer) {
  const std::string where = "the configuration's \"lr_scheduler\"";
  check_keys(config, where, {"type", "step_size", "gamma", "T_max", "eta_min"});
  const auto type = value_at<std::string>(config, "type", where, "");
  if (type == "step") {
    check_keys(config, where + " of type step", {"type", "step_size", "gamma"});
    return std::make_unique<fulgor::StepLR>(optimizer, value_at<int64_t>(config, "step_size", where, 1),
                                            value_at<double>(config, "gamma", where, 0.1));
  }
  if (type == "cosine") {
    check_keys(config, where + " of type cosine", {"type", "T_max", "eta_min"});
    if (!config.contains("T_max")) fail(FULGOR_ERROR_CONFIG, where + " of type cosine needs \"T_max\"");
    return std::make_unique<fulgor::CosineAnnealingLR>(optimizer, value_at<int64_t>(config, "T_max", where, 1),
                                                       value_at<double>(config, "eta_min", where, 0.0));
  }
  fail(FULGOR_ERROR_CONFIG, fmt::format("{} type '{}' is unknown; known types: step, cosine", where, type));
}

// ---- Buffers -------------------------------------------------------------------

torch::ScalarType scalar_type(fulgor_dtype dtype, const char* what) {
  switch (dtype) {
    case FULGOR_FLOAT32:
      return torch::kFloat;
    case FULGOR_FLOAT64:
      return torch::kDouble;
    case FULGOR_INT32:
      return torch::kInt;
    case FULGOR_INT64:
      return torch::kLong;
  }
  fail(FULGOR_ERROR_ARGUMENT,
       fmt::format("{} dtype {} is unknown; known: FULGOR_FLOAT32, FULGOR_FLOAT64, FULGOR_INT32, FULGOR_INT64", what,
                   static_cast<int>(dtype)));
}

std::vector<int64_t> shape_of(const int64_t* shape, int32_t rank, const char* what) {
  if (rank < 0 || rank > 16) fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} rank {}: expected 0 to 16", what, rank));
  if (rank > 0 && shape == nullptr) fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} shape is a null pointer", what));
  std::vector<int64_t> sizes(shape, shape + rank);
  for (int64_t size : sizes)
    if (size < 0)
      fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} shape [{}] has a negative size", what, fmt::join(sizes, ", ")));
  return sizes;
}

// A view of the caller's buffer: on the host, or on the model's device when
// the configuration says so; never written to.
torch::Tensor view_of(const fulgor_model& model, const void* data, fulgor_dtype dtype, const int64_t* shape,
                      int32_t rank, const char* what) {
  if (data == nullptr) fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} is a null pointer", what));
  const auto options = torch::TensorOptions()
                           .dtype(scalar_type(dtype, what))
                           .device(model.device_buffers ? model.fabric->device() : torch::Device(torch::kCPU));
  return torch::from_blob(const_cast<void*>(data), shape_of(shape, rank, what), options);
}

std::string describe(const torch::Tensor& t) {
  return fmt::format("[{}] {}", fmt::join(t.sizes(), ", "), c10::toString(t.scalar_type()));
}

// The label must fit the loss: the output's shape and a floating type for a
// regression loss, the output's shape without the class dimension and an
// integer type for a classification loss.
torch::Tensor checked_label(const std::string& loss, const torch::Tensor& output, torch::Tensor label) {
  if (loss == "cross_entropy" || loss == "nll") {
    if (label.is_floating_point() || output.dim() < 1 || label.dim() != output.dim() - 1 ||
        (label.dim() > 0 && label.size(0) != output.size(0)))
      fail(FULGOR_ERROR_SHAPE, fmt::format("label {} does not fit loss '{}' of output {}: expected class indices of an "
                                           "integer dtype, one per row of the output",
                                           describe(label), loss, describe(output)));
    return label.to(torch::kLong);
  }
  if (label.sizes() != output.sizes() || !label.is_floating_point())
    fail(FULGOR_ERROR_SHAPE, fmt::format("label {} does not fit loss '{}' of output {}: expected the output's shape "
                                         "and a floating-point dtype",
                                         describe(label), loss, describe(output)));
  return label.to(output.scalar_type());
}

torch::Tensor forward(fulgor_model& model, const torch::Tensor& input) {
  try {
    return model.module->forward(input.to(model.fabric->device()));
  } catch (const fulgor::ConfigError& e) {
    fail(FULGOR_ERROR_MODEL, e.what());
  }
}

fulgor_model& checked(fulgor_model* model) {
  if (model == nullptr) fail(FULGOR_ERROR_ARGUMENT, "the model is a null pointer");
  return *model;
}

}  // namespace

extern "C" {

const char* fulgor_last_error(void) { return last_error.c_str(); }

fulgor_status fulgor_model_create(const char* torchscript_path, const char* config_json, fulgor_model** out) {
  return guarded(__func__, [&] {
    if (out == nullptr || torchscript_path == nullptr)
      fail(FULGOR_ERROR_ARGUMENT, "torchscript_path and model must not be null pointers");
    *out = nullptr;
    const nlohmann::json config =
        config_json == nullptr ? nlohmann::json::object() : nlohmann::json::parse(config_json, nullptr, false);
    if (config.is_discarded()) fail(FULGOR_ERROR_CONFIG, "the configuration is not JSON");
    const std::string where = "the configuration";
    check_keys(config, where, {"accelerator", "precision", "loss", "optimizer", "lr_scheduler", "seed", "buffers"});
    const auto buffers = value_at<std::string>(config, "buffers", where, "host");
    if (buffers != "host" && buffers != "device")
      fail(FULGOR_ERROR_CONFIG,
           fmt::format("the configuration's \"buffers\" is '{}'; expected host or device", buffers));
    if (config.contains("seed")) fulgor::seed_everything(value_at<uint64_t>(config, "seed", where, 0));

    auto model = std::make_unique<fulgor_model>();
    model->device_buffers = buffers == "device";
    fulgor::FabricOptions options;
    options.accelerator = value_at<std::string>(config, "accelerator", where, "auto");
    options.precision = value_at<std::string>(config, "precision", where, "32-true");
    // One device per process: the launcher's processes, or this one alone.
    options.devices =
        fulgor::detect_distributed_environment().is_distributed() ? fulgor::Devices("auto") : fulgor::Devices(1);
    model->fabric = std::make_unique<fulgor::Fabric>(options);
    model->fabric->launch();
    fulgor::TorchScriptOptions script_options;
    script_options.loss = model->loss = value_at<std::string>(config, "loss", where, "mse");
    try {
      model->module = std::make_unique<fulgor::TorchScriptModule>(torchscript_path, script_options);
    } catch (const fulgor::ConfigError& e) {
      fail(std::string(e.what()).find("unknown loss") != std::string::npos ? FULGOR_ERROR_CONFIG : FULGOR_ERROR_MODEL,
           e.what());
    }
    model->fabric->setup_module(*model->module);
    model->optimizer = make_optimizer(config.value("optimizer", nlohmann::json::object()), model->module->parameters());
    model->fabric->setup_optimizers(*model->optimizer);
    if (config.contains("lr_scheduler"))
      model->scheduler = make_scheduler(config.at("lr_scheduler"), *model->optimizer);
    *out = model.release();
  });
}

void fulgor_model_destroy(fulgor_model* model) {
  guarded(__func__, [&] { delete model; });
}

fulgor_status fulgor_train(fulgor_model* handle, const void* input, fulgor_dtype input_dtype,
                           const int64_t* input_shape, int32_t input_rank, const void* label, fulgor_dtype label_dtype,
                           const int64_t* label_shape, int32_t label_rank, double* loss) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    fulgor::Fabric& fabric = *model.fabric;
    const torch::Tensor x = view_of(model, input, input_dtype, input_shape, input_rank, "input");
    const torch::Tensor y = view_of(model, label, label_dtype, label_shape, label_rank, "label");
    // Setting the script module's mode walks all its submodules: only on a change.
    if (!model.module->is_training()) model.module->train();
    model.optimizer->zero_grad();
    torch::Tensor value;
    {
      auto autocast = fabric.autocast();
      const torch::Tensor output = forward(model, x);
      value = model.module->loss(output, checked_label(model.loss, output, y.to(fabric.device())));
    }
    fabric.backward(value);
    fabric.step(*model.optimizer);
    if (model.scheduler) model.scheduler->step();
    ++model.steps;
    if (loss != nullptr) *loss = value.item<double>();
  });
}

fulgor_status fulgor_predict(fulgor_model* handle, const void* input, fulgor_dtype input_dtype,
                             const int64_t* input_shape, int32_t input_rank, void* output, fulgor_dtype output_dtype,
                             const int64_t* output_shape, int32_t output_rank) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    const torch::Tensor x = view_of(model, input, input_dtype, input_shape, input_rank, "input");
    torch::Tensor out = view_of(model, output, output_dtype, output_shape, output_rank, "output");
    torch::NoGradGuard no_grad;
    if (model.module->is_training()) model.module->eval();
    torch::Tensor prediction;
    {
      auto autocast = model.fabric->autocast();
      prediction = forward(model, x);
    }
    if (prediction.sizes() != out.sizes())
      fail(FULGOR_ERROR_SHAPE,
           fmt::format("output buffer {} does not fit the model's output {}", describe(out), describe(prediction)));
    out.copy_(prediction);
  });
}

fulgor_status fulgor_save(fulgor_model* handle, const char* path) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    if (path == nullptr) fail(FULGOR_ERROR_ARGUMENT, "the path is a null pointer");
    fulgor::FabricState state{{"model", *model.module}, {"optimizer", *model.optimizer}, {"steps", model.steps}};
    if (model.scheduler) state.emplace_back("lr_scheduler", *model.scheduler);
    model.fabric->save(path, state);
  });
}

fulgor_status fulgor_load(fulgor_model* handle, const char* path) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    if (path == nullptr) fail(FULGOR_ERROR_ARGUMENT, "the path is a null pointer");
    fulgor::FabricState state{{"model", *model.module}, {"optimizer", *model.optimizer}, {"steps", model.steps}};
    if (model.scheduler) state.emplace_back("lr_scheduler", *model.scheduler);
    model.fabric->load(path, state);
  });
}

fulgor_status fulgor_model_rank(const fulgor_model* model, int64_t* rank, int64_t* world_size) {
  return guarded(__func__, [&] {
    if (model == nullptr) fail(FULGOR_ERROR_ARGUMENT, "the model is a null pointer");
    if (rank != nullptr) *rank = model->fabric->global_rank();
    if (world_size != nullptr) *world_size = model->fabric->world_size();
  });
}

}  // extern "C"
