#include "fulgor/interop/lightning_checkpoint.h"

#include <fmt/format.h>
#include <torch/serialize/input-archive.h>

#include <set>

#include "checkpoint/meta.h"
#include "detail/demangle.h"
#include "fulgor/checkpoint/checkpoint.h"
#include "fulgor/core/error.h"
#include "fulgor/interop/optimizer_state.h"
#include "fulgor/interop/torch_save.h"

// Note [Writing a Lightning checkpoint]
// Lightning 2.6 reads, of a .ckpt: "state_dict" (load_from_checkpoint and
// fit's restore_model, by the LightningModule's attribute names, strictly by
// default), "hyper_parameters" (the constructor's keyword arguments; with
// "hparams_name" "kwargs", as save_hyperparameters() records them) and, to
// resume a fit, "optimizer_states" (each optimizer's load_state_dict) and
// "lr_schedulers" (zipped with the configured schedulers: a shorter list
// leaves the rest as constructed). "loops" and "callbacks" are optional:
// restore_loops skips a missing "loops", and the callbacks read
// checkpoint.get("callbacks"). fulgor's loops and callbacks keep their
// states in its own shapes, so both are left out, and Lightning counts its
// steps from zero again; "epoch" and "global_step" are written, as Lightning
// writes them, "for compatibility".
// A torch scheduler's load_state_dict updates its __dict__ with what it is
// given, so writing the counters alone (last_epoch, _step_count, base_lrs,
// _last_lr; T_i and T_cur of warm restarts) leaves the schedule's own
// parameters as the Python code constructs them.

namespace fulgor {
namespace {

c10::IValue ivalue_of(const nlohmann::json& j) {
  if (j.is_null()) return {};
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  if (j.is_array()) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (const auto& item : j) list.push_back(ivalue_of(item));
    return list;
  }
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [key, value] : j.items()) dict.insert(key, ivalue_of(value));
  return dict;
}

// torch's state_dict of the schedule, where fulgor's state is the counters
// torch keeps (Note [Writing a Lightning checkpoint]).
std::optional<c10::IValue> torch_scheduler_state(const LRScheduler& scheduler) {
  static const std::set<std::string> mapped = {"last_epoch", "step_count", "base_lrs", "last_lr", "T_i", "T_cur"};
  const nlohmann::json state = scheduler.state_dict();
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : state.items()) {
    if (mapped.count(key) == 0) return std::nullopt;
    out[key == "step_count" || key == "last_lr" ? "_" + key : key] = value;
  }
  c10::IValue dict = ivalue_of(out);
  // base_lrs and _last_lr are floats even where a rate is whole.
  for (const char* key : {"base_lrs", "_last_lr"}) {
    c10::impl::GenericList rates(c10::AnyType::get());
    for (const auto& rate : out.at(key)) rates.push_back(rate.get<double>());
    dict.toGenericDict().insert_or_assign(key, rates);
  }
  return dict;
}

}  // namespace

LightningCheckpointReport save_lightning_checkpoint(const torch::nn::Module& module, const OptimizerConfig& optim,
                                                    const std::filesystem::path& path,
                                                    const LightningCheckpointOptions& options) {
  if (!options.hyper_parameters.is_null() && !options.hyper_parameters.is_object())
    throw InteropError(
        fmt::format("save_lightning_checkpoint('{}'): hyper_parameters is a JSON {}; accepted: an "
                    "object (the LightningModule's keyword arguments) or null",
                    path.string(), options.hyper_parameters.type_name()));
  LightningCheckpointReport report;
  c10::impl::GenericDict ckpt(c10::StringType::get(), c10::AnyType::get());
  ckpt.insert("epoch", options.epoch);
  ckpt.insert("global_step", options.global_step);
  ckpt.insert("pytorch-lightning_version", options.lightning_version);
  c10::impl::GenericDict state(c10::StringType::get(), c10::TensorType::get());
  for (const auto& entry : state_dict_of(module)) state.insert(options.prefix + entry.key(), entry.value());
  ckpt.insert("state_dict", state);
  c10::impl::GenericList optimizers(c10::AnyType::get());
  for (const auto& optimizer : optim.optimizers) optimizers.push_back(export_optimizer_state(*optimizer));
  ckpt.insert("optimizer_states", optimizers);
  c10::impl::GenericList schedulers(c10::AnyType::get());
  for (size_t i = 0; i < optim.schedulers.size(); ++i) {
    const LRScheduler& scheduler = *optim.schedulers[i].scheduler;
    std::optional<c10::IValue> torch_state =
        report.left_out.empty() ? torch_scheduler_state(scheduler) : std::optional<c10::IValue>();
    if (torch_state) {
      schedulers.push_back(*torch_state);
      continue;
    }
    report.left_out.push_back(fmt::format(
        "lr_schedulers[{}]: {}{}", i, detail::demangle(typeid(scheduler).name()),
        report.left_out.empty() ? "'s state has no torch counterpart fulgor writes" : ", after one left out"));
  }
  ckpt.insert("lr_schedulers", schedulers);
  if (!options.hyper_parameters.is_null()) {
    ckpt.insert("hparams_name", "kwargs");
    ckpt.insert("hyper_parameters", ivalue_of(options.hyper_parameters));
  }
  torch_save(ckpt, path);
  return report;
}

LightningCheckpointReport export_lightning_checkpoint(ModuleBase& module,
                                                      const std::filesystem::path& fulgor_checkpoint,
                                                      const std::filesystem::path& path,
                                                      LightningCheckpointOptions options) {
  const std::string source = fulgor_checkpoint.string();
  torch::serialize::InputArchive archive = read_checkpoint_file(source);
  const nlohmann::json meta = detail::parse_checkpoint_meta(archive, source);
  torch::serialize::InputArchive model_archive;
  if (!archive.try_read("model", model_archive))
    throw CheckpointError(fmt::format("checkpoint '{}' has no model state", source));
  detail::load_module_state(module, model_archive, source);
  OptimizerConfig optim = module.configure_optimizers();
  const auto n_optimizers = meta.at("optimizers").get<size_t>();
  const auto& schedulers = meta.at("schedulers");
  if (n_optimizers != optim.optimizers.size() || schedulers.size() != optim.schedulers.size())
    throw CheckpointError(
        fmt::format("checkpoint '{}' holds {} optimizer and {} scheduler states; "
                    "configure_optimizers returned {} and {}",
                    source, n_optimizers, schedulers.size(), optim.optimizers.size(), optim.schedulers.size()));
  try {
    for (size_t i = 0; i < n_optimizers; ++i) {
      torch::serialize::InputArchive optimizer_archive;
      archive.read("optimizer_" + std::to_string(i), optimizer_archive);
      optim.optimizers[i]->load(optimizer_archive);
    }
    for (size_t i = 0; i < schedulers.size(); ++i) optim.schedulers[i].scheduler->load_state_dict(schedulers[i]);
  } catch (const std::exception& e) {
    throw CheckpointError(
        fmt::format("checkpoint '{}': its optimizer states do not fit the module's: {}", source, e.what()));
  }
  options.epoch = meta.at("loop").at("epoch").get<int64_t>();
  options.global_step = meta.at("loop").at("global_step").get<int64_t>();
  options.hyper_parameters = meta.value("hparams", nlohmann::json());
  if (options.hyper_parameters.is_object() && options.hyper_parameters.empty()) options.hyper_parameters = nullptr;
  return save_lightning_checkpoint(module, optim, path, options);
}

}  // namespace fulgor
