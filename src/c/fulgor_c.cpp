// The C API (include/fulgor/c/fulgor.h): a TorchScriptModule trained by a
// Fabric, behind opaque handles and status codes.

#include "fulgor/c/fulgor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "c/buffers.h"
#include "c/configuration.h"
#include "c/failure.h"
#include "c/file_kind.h"
#include "fulgor/config/seed.h"
#include "fulgor/core/error.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/fabric/fabric.h"
#include "fulgor/jit/torchscript_module.h"
#include "fulgor/optim/scheduler.h"
#include "fulgor/optim/zero_grad.h"

namespace {

// Note [Handle check]
// Every call reads a handle's first member before anything else: a live
// model holds kLiveModel there, and fulgor_model_destroy overwrites it before
// the memory is freed. A destroyed handle, or a pointer to something else,
// is then answered FULGOR_ERROR_ARGUMENT instead of used. The check reads
// eight bytes the pointer points to, so it cannot help a pointer to memory
// the program does not own, nor a destroyed handle whose memory a new model
// has taken since: set a handle to NULL once destroyed.
constexpr uint64_t kLiveModel = 0x31766c65646f6d66;  // "fmodelv1"

}  // namespace

struct fulgor_model {
  uint64_t magic = kLiveModel;  // first: Note [Handle check]
  std::unique_ptr<fulgor::Fabric> fabric;
  std::unique_ptr<fulgor::TorchScriptModule> module;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<fulgor::LRScheduler> scheduler;
  std::string loss;  // a built-in's name, when loss_script is null
  std::unique_ptr<torch::jit::Module> loss_script;
  bool device_buffers = false;
  int64_t steps = 0;
};

namespace {

using fulgor::c_api::fail;
using fulgor::c_api::Failure;

thread_local std::string last_error;

fulgor_status failed(const char* function, fulgor_status status, const std::string& message) {
  last_error = fmt::format("{}: {}", function, message);
  return status;
}

// Runs `body`, turning every exception into a status and a message: none
// crosses into the caller's language.
template <typename Body>
fulgor_status guarded(const char* function, Body&& body) {
  try {
    body();
    return FULGOR_OK;
  } catch (const Failure& f) {
    return failed(function, f.status, f.message);
  } catch (const fulgor::DeviceError& e) {
    return failed(function, FULGOR_ERROR_DEVICE, e.what());
  } catch (const fulgor::CheckpointError& e) {
    return failed(function, FULGOR_ERROR_CHECKPOINT, e.what());
  } catch (const fulgor::ConfigError& e) {
    return failed(function, FULGOR_ERROR_CONFIG, e.what());
  } catch (const fulgor::RegistryError& e) {
    // Unknown names are refused with the configuration: what is left is
    // "auto" or "gpu" finding no accelerator available here.
    return failed(function, FULGOR_ERROR_DEVICE, e.what());
  } catch (const c10::OutOfMemoryError& e) {
    return failed(function, FULGOR_ERROR_DEVICE, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return failed(function, FULGOR_ERROR_INTERNAL, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return failed(function, FULGOR_ERROR_INTERNAL, e.what());
  } catch (...) {
    return failed(function, FULGOR_ERROR_INTERNAL, "an unknown exception");
  }
}

template <typename Model>
Model& checked(Model* model) {
  if (model == nullptr) fail(FULGOR_ERROR_ARGUMENT, "the model is a null pointer");
  if (model->magic != kLiveModel)
    fail(FULGOR_ERROR_ARGUMENT,
         "the model is not a live model: it was destroyed, or was not made by fulgor_model_create");
  return *model;
}

torch::Device buffer_device(const fulgor_model& model) {
  return model.device_buffers ? model.fabric->device() : torch::Device(torch::kCPU);
}

// The script's outputs: one tensor, or a tuple or list of tensors.
std::vector<torch::Tensor> tensors_of(const torch::jit::IValue& value, const std::string& what) {
  if (value.isTensor()) return {value.toTensor()};
  std::vector<torch::jit::IValue> items;
  if (value.isTuple()) items = value.toTupleRef().elements().vec();
  if (value.isList()) items = value.toList().vec();
  if (items.empty() || !std::all_of(items.begin(), items.end(), [](const auto& v) { return v.isTensor(); }))
    fail(FULGOR_ERROR_MODEL,
         fmt::format("{} returned a {}; expected a tensor, or a tuple or list of tensors", what, value.tagKind()));
  std::vector<torch::Tensor> tensors;
  for (const auto& item : items) tensors.push_back(item.toTensor());
  return tensors;
}

std::vector<torch::Tensor> forward(fulgor_model& model, const std::vector<torch::Tensor>& inputs) {
  std::vector<torch::jit::IValue> arguments;
  for (const auto& input : inputs) arguments.emplace_back(input.to(model.fabric->device()));
  const std::string what = fmt::format("the model '{}'", model.module->source());
  torch::jit::IValue outputs;
  try {
    outputs = model.module->script().forward(std::move(arguments));
  } catch (const c10::Error& e) {
    fail(FULGOR_ERROR_MODEL,
         fmt::format("{}: forward failed on the given inputs: {}", what, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    fail(FULGOR_ERROR_MODEL, fmt::format("{}: forward failed on the given inputs: {}", what, e.what()));
  }
  return tensors_of(outputs, what + "'s forward");
}

// The loss of `outputs` against `labels` (on the model's device): the
// built-in's of one output and one label, or the TorchScript loss's.
torch::Tensor loss_of(fulgor_model& model, const std::vector<torch::Tensor>& outputs,
                      const std::vector<torch::Tensor>& labels) {
  const auto device = model.fabric->device();
  if (!model.loss_script) {
    if (outputs.size() != 1 || labels.size() != 1)
      fail(FULGOR_ERROR_SHAPE, fmt::format("loss '{}' takes one output and one label; the model gave {} output(s) "
                                           "for {} label(s): configure a TorchScript loss (\"loss\": {{\"type\": "
                                           "\"torchscript\", \"path\": ...}}) for several",
                                           model.loss, outputs.size(), labels.size()));
    return model.module->loss(outputs[0], fulgor::c_api::checked_label(model.loss, outputs[0], labels[0].to(device)));
  }
  std::vector<torch::jit::IValue> arguments(outputs.begin(), outputs.end());
  for (const auto& label : labels) arguments.emplace_back(label.to(device));
  torch::jit::IValue value;
  try {
    value = model.loss_script->forward(std::move(arguments));
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    fail(FULGOR_ERROR_MODEL,
         fmt::format("the TorchScript loss failed on {} output(s) and {} label(s): {}", outputs.size(), labels.size(),
                     c10_error ? c10_error->what_without_backtrace() : e.what()));
  }
  if (!value.isTensor() || value.toTensor().numel() != 1)
    fail(FULGOR_ERROR_MODEL, fmt::format("the TorchScript loss returned {}; expected a tensor of one element",
                                         value.isTensor() ? fulgor::c_api::describe(value.toTensor())
                                                          : std::string("a ") + value.tagKind()));
  return value.toTensor().reshape({});
}

// Views of the caller's `n` buffers `tensors`, named what[0], what[1], ...
std::vector<torch::Tensor> views_of(const fulgor_tensor* tensors, int32_t n, int32_t at_least, torch::Device device,
                                    const char* what) {
  if (n < at_least || n > 64)
    fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} {} buffers: expected {} to 64", n, what, at_least));
  if (n > 0 && tensors == nullptr) fail(FULGOR_ERROR_ARGUMENT, fmt::format("{} is a null pointer", what));
  std::vector<torch::Tensor> views;
  for (int32_t k = 0; k < n; ++k) {
    const fulgor_tensor& t = tensors[k];
    views.push_back(
        fulgor::c_api::view_of(t.data, t.dtype, t.shape, t.rank, device, fmt::format("{}[{}]", what, k).c_str()));
  }
  return views;
}

std::string describe_all(const std::vector<torch::Tensor>& tensors) {
  std::vector<std::string> words;
  for (const auto& t : tensors) words.push_back(fulgor::c_api::describe(t));
  return fmt::format("{}", fmt::join(words, ", "));
}

// One training step of fulgor_train and fulgor_train_multiarg.
double train_step(fulgor_model& model, const std::vector<torch::Tensor>& inputs,
                  const std::vector<torch::Tensor>& labels) {
  const auto empty = [](const torch::Tensor& t) { return t.numel() == 0; };
  if (std::any_of(inputs.begin(), inputs.end(), empty) || std::any_of(labels.begin(), labels.end(), empty))
    fail(FULGOR_ERROR_SHAPE, fmt::format("input(s) {} and label(s) {}: an empty batch, of which no loss can be taken",
                                         describe_all(inputs), describe_all(labels)));
  fulgor::Fabric& fabric = *model.fabric;
  // Setting the script module's mode walks all its submodules: only on a change.
  if (!model.module->is_training()) model.module->train();
  fulgor::zero_grad(*model.optimizer);
  torch::Tensor value;
  {
    auto autocast = fabric.autocast();
    value = loss_of(model, forward(model, inputs), labels);
  }
  fabric.backward(value);
  fabric.step(*model.optimizer);
  if (model.scheduler) model.scheduler->step();
  ++model.steps;
  return value.item<double>();
}

// Forward without gradients in evaluation mode into `outputs`.
void predict(fulgor_model& model, const std::vector<torch::Tensor>& inputs, std::vector<torch::Tensor> outputs) {
  torch::NoGradGuard no_grad;
  if (model.module->is_training()) model.module->eval();
  std::vector<torch::Tensor> predictions;
  {
    auto autocast = model.fabric->autocast();
    predictions = forward(model, inputs);
  }
  bool fits = predictions.size() == outputs.size();
  for (size_t k = 0; fits && k < outputs.size(); ++k) fits = predictions[k].sizes() == outputs[k].sizes();
  if (!fits)
    fail(FULGOR_ERROR_SHAPE, fmt::format("output buffer(s) {} do not fit the model's output(s) {}",
                                         describe_all(outputs), describe_all(predictions)));
  for (size_t k = 0; k < outputs.size(); ++k) outputs[k].copy_(predictions[k]);
}

// The model file: refused, saying what it is, when it is no TorchScript.
void check_model_file(const std::string& path) {
  const auto file = fulgor::c_api::inspect_file(path);
  using fulgor::c_api::FileKind;
  if (file.kind == FileKind::unreadable) fail(FULGOR_ERROR_MODEL, fmt::format("'{}': {}", path, file.words));
  if (file.kind != FileKind::torchscript && file.kind != FileKind::other)
    fail(FULGOR_ERROR_MODEL, fmt::format("'{}' is {}, not a TorchScript file (torch.jit.save of a scripted or "
                                         "traced module)",
                                         path, file.words));
}

// The TorchScript loss: refused, saying what it is, when it is no TorchScript.
std::unique_ptr<torch::jit::Module> load_loss(const std::string& path, torch::Device device) {
  const auto file = fulgor::c_api::inspect_file(path);
  using fulgor::c_api::FileKind;
  if (file.kind == FileKind::unreadable) fail(FULGOR_ERROR_MODEL, fmt::format("the loss '{}': {}", path, file.words));
  if (file.kind != FileKind::torchscript)
    fail(FULGOR_ERROR_MODEL, fmt::format("the loss '{}' is {}, not a TorchScript file (torch.jit.save of a scripted "
                                         "module)",
                                         path, file.words));
  try {
    return std::make_unique<torch::jit::Module>(torch::jit::load(path, device));
  } catch (const c10::Error& e) {
    fail(FULGOR_ERROR_MODEL, fmt::format("the loss '{}' cannot be loaded: {}", path, e.what_without_backtrace()));
  }
}

std::unique_ptr<fulgor_model> make_model(const std::string& path, const fulgor::c_api::Configuration& config) {
  check_model_file(path);
  if (config.seed) fulgor::seed_everything(*config.seed);
  auto model = std::make_unique<fulgor_model>();
  model->device_buffers = config.device_buffers;
  model->loss = config.loss;
  fulgor::FabricOptions options;
  options.accelerator = config.accelerator;
  options.precision = config.precision;
  // One device per process: the launcher's processes, or this one alone.
  options.devices =
      fulgor::detect_distributed_environment().is_distributed() ? fulgor::Devices("auto") : fulgor::Devices(1);
  if (config.strategy) options.strategy = *config.strategy;
  if (config.sharding_strategy) options.sharding_strategy = *config.sharding_strategy;
  if (config.zero_redundancy_optimizer) options.zero_redundancy_optimizer = *config.zero_redundancy_optimizer;
  if (config.state_dict_type) options.state_dict_type = *config.state_dict_type;
  options.ddp_timeout = config.ddp_timeout;
  model->fabric = std::make_unique<fulgor::Fabric>(options);
  model->fabric->launch();
  fulgor::TorchScriptOptions script_options;
  script_options.loss = config.loss;
  try {
    model->module = std::make_unique<fulgor::TorchScriptModule>(path, script_options);
  } catch (const fulgor::ConfigError& e) {
    fail(std::string(e.what()).find("unknown loss") != std::string::npos ? FULGOR_ERROR_CONFIG : FULGOR_ERROR_MODEL,
         e.what());
  }
  model->fabric->setup_module(*model->module);
  if (!config.loss_script.empty()) model->loss_script = load_loss(config.loss_script, model->fabric->device());
  model->optimizer = fulgor::c_api::make_optimizer(config.optimizer, model->module->parameters());
  model->fabric->setup_optimizers(*model->optimizer);
  if (!config.lr_scheduler.is_null())
    model->scheduler = fulgor::c_api::make_scheduler(config.lr_scheduler, *model->optimizer);
  return model;
}

fulgor::FabricState state_of(fulgor_model& model) {
  fulgor::FabricState state{{"model", *model.module}, {"optimizer", *model.optimizer}, {"steps", model.steps}};
  if (model.scheduler) state.emplace_back("lr_scheduler", *model.scheduler);
  return state;
}

}  // namespace

extern "C" {

const char* fulgor_last_error(void) { return last_error.c_str(); }

fulgor_status fulgor_model_create(const char* torchscript_path, const char* config_json, fulgor_model** out) {
  return guarded(__func__, [&] {
    if (out == nullptr || torchscript_path == nullptr)
      fail(FULGOR_ERROR_ARGUMENT, "torchscript_path and model must not be null pointers");
    *out = nullptr;
    *out = make_model(torchscript_path, fulgor::c_api::read_configuration(config_json)).release();
  });
}

void fulgor_model_destroy(fulgor_model* model) {
  guarded(__func__, [&] {
    if (model == nullptr) return;
    checked(model).magic = 0;
    delete model;
  });
}

fulgor_status fulgor_model_create_from_file(const char* torchscript_path, const char* config_path, fulgor_model** out) {
  return guarded(__func__, [&] {
    if (out == nullptr || torchscript_path == nullptr)
      fail(FULGOR_ERROR_ARGUMENT, "torchscript_path and model must not be null pointers");
    *out = nullptr;
    *out = make_model(torchscript_path, fulgor::c_api::read_configuration_file(config_path)).release();
  });
}

fulgor_status fulgor_train(fulgor_model* handle, const void* input, fulgor_dtype input_dtype,
                           const int64_t* input_shape, int32_t input_rank, const void* label, fulgor_dtype label_dtype,
                           const int64_t* label_shape, int32_t label_rank, double* loss) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    const auto device = buffer_device(model);
    const double value =
        train_step(model, {fulgor::c_api::view_of(input, input_dtype, input_shape, input_rank, device, "input")},
                   {fulgor::c_api::view_of(label, label_dtype, label_shape, label_rank, device, "label")});
    if (loss != nullptr) *loss = value;
  });
}

fulgor_status fulgor_train_multiarg(fulgor_model* handle, const fulgor_tensor* inputs, int32_t n_inputs,
                                    const fulgor_tensor* labels, int32_t n_labels, double* loss) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    const auto device = buffer_device(model);
    const double value = train_step(model, views_of(inputs, n_inputs, 1, device, "inputs"),
                                    views_of(labels, n_labels, 0, device, "labels"));
    if (loss != nullptr) *loss = value;
  });
}

fulgor_status fulgor_predict(fulgor_model* handle, const void* input, fulgor_dtype input_dtype,
                             const int64_t* input_shape, int32_t input_rank, void* output, fulgor_dtype output_dtype,
                             const int64_t* output_shape, int32_t output_rank) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    const auto device = buffer_device(model);
    predict(model, {fulgor::c_api::view_of(input, input_dtype, input_shape, input_rank, device, "input")},
            {fulgor::c_api::view_of(output, output_dtype, output_shape, output_rank, device, "output")});
  });
}

fulgor_status fulgor_predict_multiarg(fulgor_model* handle, const fulgor_tensor* inputs, int32_t n_inputs,
                                      const fulgor_tensor* outputs, int32_t n_outputs) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    const auto device = buffer_device(model);
    predict(model, views_of(inputs, n_inputs, 1, device, "inputs"), views_of(outputs, n_outputs, 1, device, "outputs"));
  });
}

fulgor_status fulgor_save(fulgor_model* handle, const char* path) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    if (path == nullptr) fail(FULGOR_ERROR_ARGUMENT, "the path is a null pointer");
    model.fabric->save(path, state_of(model));
  });
}

// Note [A TorchScript model resumed]
// A loaded checkpoint restores every number of the model, its optimizer and
// schedule, yet the steps after it match the uninterrupted run's only up to
// rounding: LibTorch's TorchScript executor profiles a graph's first runs and
// then optimizes it, and the optimized graph rounds otherwise. A model made
// afresh to resume runs its first steps unoptimized where the uninterrupted
// one ran optimized (PyTorch behaves the same; with the executor's
// optimization off, torch::jit::setGraphExecutorOptimize(false), a resume
// is bit-equal).
fulgor_status fulgor_load(fulgor_model* handle, const char* path) {
  return guarded(__func__, [&] {
    fulgor_model& model = checked(handle);
    if (path == nullptr) fail(FULGOR_ERROR_ARGUMENT, "the path is a null pointer");
    const auto file = fulgor::c_api::inspect_file(path);
    if (file.kind == fulgor::c_api::FileKind::unreadable)
      fail(FULGOR_ERROR_CHECKPOINT, fmt::format("'{}': {}", path, file.words));
    if (file.kind != fulgor::c_api::FileKind::checkpoint)
      fail(FULGOR_ERROR_CHECKPOINT,
           fmt::format("'{}' is {}, not a checkpoint: fulgor_load reads what fulgor_save wrote", path, file.words));
    try {
      model.fabric->load(path, state_of(model));
    } catch (const fulgor::CheckpointError& e) {
      // Fabric's advice names an option of its own; the C API's answer is a
      // checkpoint of a model configured alike.
      std::string message = e.what();
      const std::string advice = " (load with strict = false to skip it)";
      if (const auto at = message.find(advice); at != std::string::npos)
        message.replace(at, advice.size(),
                        ": it was saved by a model configured otherwise (a \"lr_scheduler\" or none); load a "
                        "checkpoint of a model configured alike");
      fail(FULGOR_ERROR_CHECKPOINT, message);
    }
  });
}

fulgor_status fulgor_model_rank(const fulgor_model* handle, int64_t* rank, int64_t* world_size) {
  return guarded(__func__, [&] {
    const fulgor_model& model = checked(handle);
    if (rank != nullptr) *rank = model.fabric->global_rank();
    if (world_size != nullptr) *world_size = model.fabric->world_size();
  });
}

}  // extern "C"
