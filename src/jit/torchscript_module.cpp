#include "fulgor/jit/torchscript_module.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

#include "fulgor/core/error.h"

// LibTorch exports the switch of CPU fusion on every version; Debian's
// packages leave out the header that declares it.
#if __has_include(<torch/csrc/jit/codegen/fuser/interface.h>)
#include <torch/csrc/jit/codegen/fuser/interface.h>
#else
namespace torch::jit {
TORCH_API void overrideCanFuseOnCPU(bool value);
}
#endif

namespace fulgor {

namespace {

// Note [TorchScript's CPU fusion]
// LibTorch's graph executor fuses a script's CPU operators into kernels it
// compiles (the TensorExpr fuser) from the third run of a method on. Debian's
// LibTorch 2.6 enables it, and its compiler never returns on the first fused
// training step (Python's torch.jit.load hangs there alike, and runs once
// torch._C._jit_override_can_fuse_on_cpu(False)); Debian's 1.13 has it off.
// A TorchScriptModule therefore turns CPU fusion off for the process, as 1.13
// has it; GPU fusion is left as LibTorch sets it.
void keep_cpu_fusion_off() { torch::jit::overrideCanFuseOnCPU(false); }

torch::jit::Module load_script(const std::string& path) {
  try {
    return torch::jit::load(path);
  } catch (const c10::Error& e) {
    throw ConfigError(fmt::format("'{}' is not a TorchScript file (torch.jit.save of a scripted or traced module): {}",
                                  path, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("'{}' is not a TorchScript file (torch.jit.save of a scripted or traced module): {}",
                                  path, e.what()));
  }
}

// Note [A script module's tensors]
// torch::nn::Module names its parameters without dots, one module per level,
// so each level of the script module becomes a plain torch::nn::Module of the
// same name holding that level's own parameters and buffers: the very tensors
// of the script module's slots (register_parameter keeps the tensor it is
// given), so that everything done to them in place (Accelerator::move_module,
// a checkpoint's load, an optimizer's step) is what the script computes with.
void mirror(const torch::jit::Module& script, torch::nn::Module& into) {
  for (const auto& p : script.named_parameters(/*recurse=*/false))
    into.register_parameter(p.name, p.value, p.value.requires_grad());
  for (const auto& b : script.named_buffers(/*recurse=*/false)) into.register_buffer(b.name, b.value);
  for (const auto& child : script.named_children()) {
    auto level = std::make_shared<torch::nn::Module>(child.name);
    mirror(child.value, *level);
    into.register_module(child.name, level);
  }
}

}  // namespace

TorchScriptModule::TorchScriptModule(const std::string& path, TorchScriptOptions options)
    : TorchScriptModule(load_script(path), path, std::move(options)) {}

TorchScriptModule::TorchScriptModule(torch::jit::Module script, std::string source, TorchScriptOptions options)
    : fulgor::Module("TorchScriptModule"),
      script_(std::move(script)),
      source_(std::move(source)),
      options_(std::move(options)) {
  keep_cpu_fusion_off();
  const auto& known = losses();
  if (std::find(known.begin(), known.end(), options_.loss) == known.end())
    throw ConfigError(fmt::format("TorchScriptModule '{}': unknown loss '{}'; known losses: {}", source_, options_.loss,
                                  fmt::join(known, ", ")));
  if (!script_.find_method("forward"))
    throw ConfigError(fmt::format("TorchScriptModule '{}': the script module has no forward method", source_));
  mirror(script_, *this);
  train(script_.is_training());
}

const std::vector<std::string>& TorchScriptModule::losses() {
  static const std::vector<std::string> names = {"mse",           "l1",  "smooth_l1",      "huber",
                                                 "cross_entropy", "nll", "bce_with_logits"};
  return names;
}

torch::Tensor TorchScriptModule::forward(std::vector<torch::jit::IValue> inputs) {
  torch::jit::IValue output;
  try {
    output = script_.forward(std::move(inputs));
  } catch (const c10::Error& e) {
    throw ConfigError(fmt::format("TorchScriptModule '{}': forward failed on the given inputs: {}", source_,
                                  e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("TorchScriptModule '{}': forward failed on the given inputs: {}", source_, e.what()));
  }
  if (!output.isTensor())
    throw ConfigError(fmt::format("TorchScriptModule '{}': forward returned a {}, where training needs a tensor",
                                  source_, output.tagKind()));
  return output.toTensor();
}

torch::Tensor TorchScriptModule::loss(const torch::Tensor& output, const torch::Tensor& target) const {
  namespace F = torch::nn::functional;
  const std::string& name = options_.loss;
  if (name == "mse") return F::mse_loss(output, target);
  if (name == "l1") return F::l1_loss(output, target);
  if (name == "smooth_l1") return F::smooth_l1_loss(output, target);
  if (name == "huber") return F::huber_loss(output, target);
  if (name == "cross_entropy") return F::cross_entropy(output, target);
  if (name == "nll") return F::nll_loss(output, target);
  return F::binary_cross_entropy_with_logits(output, target);
}

torch::Tensor TorchScriptModule::training_step(torch::data::Example<> batch, int64_t) {
  torch::Tensor value = loss(forward(batch.data), batch.target);
  log("train_loss", value.detach());
  return value;
}

void TorchScriptModule::validation_step(torch::data::Example<> batch, int64_t) {
  log("val_loss", loss(forward(batch.data), batch.target));
}

void TorchScriptModule::test_step(torch::data::Example<> batch, int64_t) {
  log("test_loss", loss(forward(batch.data), batch.target));
}

torch::Tensor TorchScriptModule::predict_step(torch::data::Example<> batch, int64_t) { return forward(batch.data); }

OptimizerConfig TorchScriptModule::configure_optimizers() {
  if (!options_.optimizer)
    throw ConfigError(fmt::format(
        "TorchScriptModule '{}' has no optimizer: set TorchScriptOptions::optimizer to make one from the parameters",
        source_));
  return options_.optimizer(parameters());
}

void TorchScriptModule::train(bool on) {
  fulgor::Module::train(on);
  script_.train(on);
}

}  // namespace fulgor
