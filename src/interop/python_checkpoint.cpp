#include "interop/python_checkpoint.h"

#include <fmt/format.h>

#include <cstdint>

#include "detail/read_at.h"
#include "fulgor/core/error.h"
#include "fulgor/interop/optimizer_state.h"
#include "fulgor/interop/state_dict.h"
#include "fulgor/interop/torch_load.h"
#include "interop/ivalue_dict.h"
#include "interop/optimizer_names.h"
#include "interop/torch_load_archive.h"

// Note [Resuming a Python run]
// Trainer::fit(..., ckpt_path) takes a file Python wrote (a Lightning .ckpt,
// or {"model": ..., "optimizer": ...}) as it takes a fulgor checkpoint: the
// weights after the setup hooks, the optimizers' and schedulers' states and
// the loops' counters after on_fit_start. Lightning restores its loops from
// "loops" (its "epoch" and "global_step" are kept "for compatibility"), so
// the counters come from there: an epoch whose end hooks saved the
// checkpoint (processed ahead of completed) resumes at the next epoch, one
// begun but unprocessed resumes mid-epoch after the batches it counted. A
// checkpoint without loops starts the fit's counters at zero while the
// optimizers carry on from their states. What Python's generators, data
// module and callbacks held is not read: such a file has none of fulgor's.
// The file is translated once, as it is read (load_python_checkpoint), into
// the loaded form of fulgor's own (Note [The loaded checkpoint]), which the
// Trainer's checkpoint connector restores as it restores those.

namespace fulgor::detail {
namespace {

// The counter at dict[a][b][c], as Lightning's progress dicts nest them.
int64_t counter(const c10::IValue& dict, std::initializer_list<const char*> keys, const std::string& path) {
  const c10::IValue* at = &dict;
  for (const char* key : keys) {
    at = find_in(*at, key);
    if (at == nullptr) return 0;
  }
  if (!at->isInt() || at->toInt() < 0)
    throw CheckpointError(fmt::format("checkpoint '{}': a loop counter is a {}, not a count", path, at->tagKind()));
  return at->toInt();
}

// A torch scheduler's state_dict as fulgor's schedules keep it: the same
// names without torch's leading underscore ("_step_count", "_last_lr").
nlohmann::json scheduler_json(const c10::IValue& state, const std::string& where) {
  if (!state.isGenericDict()) throw CheckpointError(fmt::format("{} is a {}, not a dict", where, state.tagKind()));
  nlohmann::json out = nlohmann::json::object();
  auto value_json = [](const c10::IValue& v) -> nlohmann::json {
    if (v.isInt()) return v.toInt();
    if (v.isDouble()) return v.toDouble();
    if (v.isBool()) return v.toBool();
    if (v.isString()) return v.toStringRef();
    if (v.isNone()) return nullptr;
    return nlohmann::json();
  };
  for (const auto& e : state.toGenericDict()) {
    if (!e.key().isString()) continue;
    std::string key = e.key().toStringRef();
    if (!key.empty() && key[0] == '_') key.erase(0, 1);
    if (e.value().isList()) {
      nlohmann::json list = nlohmann::json::array();
      for (const c10::IValue& item : e.value().toListRef()) list.push_back(value_json(item));
      out[key] = std::move(list);
    } else if (nlohmann::json v = value_json(e.value()); !v.is_null() || e.value().isNone()) {
      out[key] = std::move(v);
    }
  }
  return out;
}

// The loops' state (FitLoop::state_dict's keys) the checkpoint resumes at:
// Lightning's fit loop progress, or the start of a fit for a checkpoint
// without one.
nlohmann::json loop_state(const c10::IValue& checkpoint, const std::string& path) {
  const c10::IValue none;
  const c10::IValue* loops = find_in(checkpoint, "loops");
  const c10::IValue& fit = loops && find_in(*loops, "fit_loop") ? *find_in(*loops, "fit_loop") : none;
  const int64_t processed = counter(fit, {"epoch_progress", "current", "processed"}, path);
  const int64_t started = counter(fit, {"epoch_progress", "current", "started"}, path);
  const int64_t completed = counter(fit, {"epoch_progress", "current", "completed"}, path);
  const int64_t global_step = counter(checkpoint, {"global_step"}, path);
  const bool finished = processed > completed;
  const bool mid_epoch = !finished && started > processed;
  return {{"epoch", completed},
          {"global_step", global_step},
          {"batches_in_epoch",
           finished || mid_epoch ? counter(fit, {"epoch_loop.batch_progress", "current", "processed"}, path) : 0},
          {"epoch_finished", finished},
          {"total_train_batches", counter(fit, {"epoch_loop.batch_progress", "total", "processed"}, path)},
          {"batches_that_stepped", counter(fit, {"epoch_loop.state_dict", "_batches_that_stepped"}, path)}};
}

// The torch schedulers' states, in order, as fulgor's metadata keeps its
// schedules' ("schedulers"): none for a checkpoint without "lr_schedulers".
nlohmann::json scheduler_states(const c10::IValue& checkpoint, const std::string& source) {
  nlohmann::json states = nlohmann::json::array();
  const c10::IValue* schedulers = find_in(checkpoint, "lr_schedulers");
  if (schedulers == nullptr || !schedulers->isList()) return states;
  const auto& list = schedulers->toListRef();
  for (size_t i = 0; i < list.size(); ++i)
    states.push_back(scheduler_json(list[i], fmt::format("{}: lr_schedulers[{}]", source, i)));
  return states;
}

}  // namespace

nlohmann::json python_checkpoint_meta(const c10::IValue& checkpoint, const std::string& path) {
  return {{"loop", loop_state(checkpoint, path)},
          {"schedulers", scheduler_states(checkpoint, "checkpoint '" + path + "'")}};
}

bool is_python_checkpoint(const RegularFile& file) {
  char head[4] = {};
  return read_at(file.fd(), 0, head, 4) && std::string(head, 4) == "PK\x03\x04";
}

LoadedCheckpoint load_python_checkpoint(const RegularFile& file, const std::string& path) {
  const std::string source = "checkpoint '" + path + "'";
  const c10::IValue checkpoint = torch_load_archive(MappedFile::map(file, path, 0, UINT64_MAX), {});
  LoadedCheckpoint ckpt;
  ckpt.path = path;
  ckpt.meta = python_checkpoint_meta(checkpoint, path);
  // The weights ("state_dict" or "model") into the module, by name, strictly.
  ckpt.restore_weights = [checkpoint, source](torch::nn::Module& module) {
    StateDict state = state_dict_from(checkpoint, source);
    try {
      load_state_dict(module, state);
    } catch (const InteropError& e) {
      throw InteropError(fmt::format("{}: {}", source, e.what()));
    }
  };
  // torch.optim's states, copied onto the parameters' devices as they are
  // imported: no move after.
  ckpt.restore_optimizers = [checkpoint, source](const LoadedCheckpoint::Optimizers& optimizers,
                                                 const torch::nn::Module& module, const Accelerator&, torch::Device) {
    const std::vector<c10::IValue> states = optimizer_states_in(checkpoint);
    if (states.size() != optimizers.size())
      throw CheckpointError(fmt::format("{} holds {} torch.optim states; configure_optimizers returned {}", source,
                                        states.size(), optimizers.size()));
    // A Lightning FSDP checkpoint names the parameters (Note [Optimizer
    // states by parameter names]).
    const ParameterNames names = parameter_names({&module});
    for (size_t i = 0; i < states.size(); ++i) {
      const std::string what = fmt::format("{}, optimizer {}", source, i);
      import_optimizer_state(*optimizers[i], by_parameter_numbers(states[i], *optimizers[i], names, what), what);
    }
  };
  return ckpt;
}

}  // namespace fulgor::detail
