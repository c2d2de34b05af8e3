#include "fulgor/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <functional>
#include <typeinfo>

#include "fulgor/callbacks/early_stopping.h"
#include "fulgor/callbacks/model_checkpoint.h"
#include "fulgor/callbacks/model_summary.h"
#include "fulgor/callbacks/progress_bar.h"
#include "fulgor/checkpoint.h"
#include "fulgor/loggers/tensorboard.h"
#include "fulgor/registry.h"
#include "fulgor/strategy.h"
#include "fulgor/version.h"
#include "json_input.h"
#include "metric_table.h"
#include "signals.h"

// Note [The per-step path]
// On a small model LibTorch's own training step runs through some 3,800
// distinct 64-byte code lines, more than the first-level instruction cache
// holds and about what the second level has room for beside the data: it is
// bound by fetching its code. Every line the Trainer adds to a step then costs
// a cache miss or two at each step, tens of nanoseconds, far more than the
// instructions in it (measured with callgrind's cache simulation and the
// overhead benchmark, docs/benchmarks.md). So the per-step path is kept
// short in code lines: rare branches (ddp, accumulation, anomaly detection,
// clipping, stops, validation) are marked unlikely so that the compiler moves
// them out of the way, the checks of precision plugins and the progress bar
// are inline or come before any other work, log() finds its names in
// MetricTables (Note [Metric tables]), and batches a loader makes on the
// device already are not moved (TensorLoader::batches_on).
#if defined(__GNUC__)
#define FULGOR_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define FULGOR_UNLIKELY(x) (x)
#endif

namespace fulgor {

std::string to_string(StopReason reason) {
  switch (reason) {
    case StopReason::max_epochs:
      return "max_epochs";
    case StopReason::max_steps:
      return "max_steps";
    case StopReason::requested:
      return "requested";
    case StopReason::signal:
      return "signal";
  }
  return "unknown";
}

namespace detail {

struct ModuleAccess {
  static void attach(ModuleBase& module, MetricSink* sink, Trainer* trainer) {
    module.sink_ = sink;
    module.trainer_ = trainer;
  }
};

namespace {

constexpr const char* kFormat = "fulgor-checkpoint";
constexpr int kFormatVersion = 1;

// Note [Checkpoint metadata]
// A checkpoint's metadata comes from a file, which may be damaged or not
// ours: before the restore trusts it, check_metadata checks the keys the
// restore reads for the types and ranges the writer gives them, so that a
// bad file is a CheckpointError naming the key, not a JSON library's error
// or a loop resumed at epoch -10^12 that never ends. The states of the
// module, the callbacks and the schedulers are theirs to read; a JSON
// library error from them becomes a CheckpointError naming the state
// (TrainerState::restoring).

// The largest loop counter a checkpoint may give: room for the loops'
// arithmetic on it (an epoch or a step more) without overflow.
constexpr int64_t kMaxCounter = int64_t{1} << 62;

void check_metadata(const nlohmann::json& meta, const std::string& path) {
  using Fits = bool (*)(const nlohmann::json&);
  auto require = [&](const nlohmann::json& parent, const char* parent_name, const char* key, Fits fits,
                     const char* expected) {
    const auto it = parent.find(key);
    if (it != parent.end() && fits(*it)) return;
    throw CheckpointError(fmt::format("checkpoint '{}' has malformed metadata: {}{} {}, expected {}", path, parent_name,
                                      key, it == parent.end() ? "is missing" : "is " + detail::json_for_message(*it),
                                      expected));
  };
  const Fits counter = [](const nlohmann::json& v) { return v.is_number_integer() && v >= 0 && v <= kMaxCounter; };
  const Fits boolean = [](const nlohmann::json& v) { return v.is_boolean(); };
  const Fits string = [](const nlohmann::json& v) { return v.is_string(); };
  const Fits array = [](const nlohmann::json& v) { return v.is_array(); };
  const Fits object = [](const nlohmann::json& v) { return v.is_object(); };
  const Fits anything = [](const nlohmann::json&) { return true; };
  const char* counter_range = "an integer from 0 to 2^62";
  require(meta, "", "loop", object, "an object");
  const auto& loop = meta.at("loop");
  for (const char* key : {"epoch", "global_step", "batches_in_epoch", "total_train_batches"})
    require(loop, "loop.", key, counter, counter_range);
  require(loop, "loop.", "epoch_finished", boolean, "true or false");
  require(meta, "", "optimizers", counter, counter_range);
  require(meta, "", "schedulers", array, "an array");
  require(meta, "", "callbacks", object, "an object");
  require(meta, "", "module", anything, "the module's state");
  require(meta, "", "accelerator", string, "a string");
}

// Which defaults log() applies, by the hook that calls it: the training
// step and batch hooks, an evaluation step and its batch hooks, or an
// epoch-end hook of training or evaluation (whose values join the epoch's).
enum class LogContext { none, train_step, eval_step, train_epoch, eval_epoch };

struct Accumulator {
  double sum = 0, weight = 0, extreme = 0;
  bool any = false, both = false;
  LogOptions options;
};

torch::Tensor cpu_rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_cpu_rng_state(const torch::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// Optimizer state read from a checkpoint lives on the CPU; LibTorch's
// optimizers keep it in typed structs, so the known ones are moved here.
void move_optimizer_state(torch::optim::Optimizer& optimizer, const Accelerator& accelerator, torch::Device device) {
  auto mv = [&](const torch::Tensor& t) {
    return t.defined() && t.device() != device ? accelerator.move_tensor(t, device, false) : t;
  };
  // Adam's and AdamW's states are unrelated types with the same tensors.
  auto move_adam = [&](auto* s) {
    s->exp_avg(mv(s->exp_avg()));
    s->exp_avg_sq(mv(s->exp_avg_sq()));
    s->max_exp_avg_sq(mv(s->max_exp_avg_sq()));
  };
  for (auto& entry : optimizer.state()) {
    auto* state = entry.second.get();
    if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(state)) {
      s->momentum_buffer(mv(s->momentum_buffer()));
    } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(state)) {
      move_adam(s);
    } else if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(state)) {
      move_adam(s);
    } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(state)) {
      s->square_avg(mv(s->square_avg()));
      s->momentum_buffer(mv(s->momentum_buffer()));
      s->grad_avg(mv(s->grad_avg()));
    } else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(state)) {
      s->sum(mv(s->sum()));
    }
  }
}

// Note [The hooks' loss]
// The batch-end hooks get the loss without its graph, so that keeping it does
// not keep the step's autograd nodes alive. backward() has consumed the graph,
// so a shallow copy of the loss without autograd metadata serves as well as
// detach() at a fraction of its cost. When no hook kept the previous step's
// copy, its TensorImpl is refilled in place (what set_data does) instead of a
// new one being allocated: on a small model, each step's allocations are a
// noticeable part of the Trainer's own work.
void refill_graph_free(torch::Tensor& copy, const torch::Tensor& loss) {
  c10::TensorImpl* impl = copy.defined() ? copy.unsafeGetTensorImpl() : nullptr;
  const bool unshared = impl && copy.use_count() == 1 && copy.weak_use_count() == 1 && !impl->autograd_meta();
  if (unshared && impl->has_compatible_shallow_copy_type(loss.key_set()))
    impl->shallow_copy_from(loss.getIntrusivePtr());
  else
    copy = loss.variable_data();
}

// Note [Overfitting a loader that shuffles]
// overfit_batches trains and validates on the first batches of the loaders
// with their shuffling turned off, as Lightning's _resolve_overfit_batches
// does. Only a loader that offers it (TensorLoader::disable_shuffle) can be
// told; any other keeps its order, and the first epoch's first batches are
// kept and replayed in every later epoch, so that it still trains on the
// same batches throughout.
void stop_shuffling(StepRunner& runner, const char* which) {
  if (runner.disable_shuffle())
    TORCH_WARN("You requested to overfit but enabled ", which, " dataloader shuffling. We are turning off the ", which,
               " dataloader shuffling for you.");
}

}  // namespace

struct LoadedCheckpoint {
  std::string path;
  torch::serialize::InputArchive archive;
  nlohmann::json meta;
};

struct TrainerState final : MetricSink {
  TrainerState(Trainer& owner, TrainerOptions opts) : trainer(owner), options(std::move(opts)) {}

  Trainer& trainer;
  TrainerOptions options;
  std::vector<std::shared_ptr<Callback>> callbacks;
  std::vector<std::shared_ptr<Logger>> loggers;
  std::unique_ptr<Accelerator> accelerator;
  // Strategy "ddp": made by the first loop, kept for the Trainer's others.
  std::unique_ptr<DdpStrategy> ddp;
  std::optional<torch::Device> device;
  ModuleBase* module = nullptr;
  OptimizerConfig optim;
  PrecisionPlugin precision;

  // Progress.
  int64_t epoch = 0, global_step = 0, batches_in_epoch = 0, total_train_batches = 0;
  // Note [Logged steps]
  // Loggers label values with Lightning's step: the optimizer steps taken
  // before the training batch that logged them, so a batch's step values and
  // a validation run after it share one label (49 for the 50th step's batch);
  // a training epoch's values carry the epoch's last label, global_step - 1
  // (Lightning's _batches_that_stepped - 1 in update_train_epoch_metrics).
  // Step values of validation_step and test_step carry instead the number of
  // evaluation batches run before theirs in this fit, validate or test call
  // (the sanity check's not counted), and no epoch, as Lightning's do.
  int64_t log_step = 0, eval_log_step = 0;
  bool epoch_finished = false;
  std::optional<int64_t> train_batches;
  int64_t max_epochs = -1;
  std::string stage, loop;
  bool sanity = false;
  bool should_stop = false;
  std::string stop_reason;
  torch::Tensor rng_epoch_start;
  // LibTorch's deterministic-algorithms setting (and its warn_only) from
  // before a loop with `deterministic` set it, put back when the loop ends.
  std::optional<std::pair<bool, bool>> deterministic_before;

  // Metrics.
  LogContext context = LogContext::none;
  int64_t current_batch_size = -1;
  // Note [Metric tables]: callback and progress bar values, and the epoch
  // accumulators, are written at every step; logger values only on due steps.
  MetricTable<double> callback_metrics, progress_bar_metrics, logged_metrics;
  std::map<std::string, double> pending_step;
  // Trainer::logs_due; skipping the step values of other batches keeps log()
  // to a few table updates.
  bool step_log_due = true;
  MetricTable<Accumulator> train_accumulators, eval_accumulators;

  // ---- Hooks ----------------------------------------------------------------
  template <typename F>
  void each_callback(F&& f) {
    for (auto& cb : callbacks) f(*cb);
  }

  // ---- Logging --------------------------------------------------------------
  void log(std::string_view name, double local_value, const LogOptions& o) override {
    // Only a training step logs in a train_step context: the common case
    // needs no string comparison.
    if (context != LogContext::train_step && loop == "predict") return;
    const double value = o.sync_dist && ddp ? ddp->reduce(local_value, o.reduce) : local_value;
    if (context == LogContext::none) {
      record_now({{std::string(name), value}}, o.prog_bar, o.logger);
      return;
    }
    const bool training = context == LogContext::train_step || context == LogContext::train_epoch;
    const bool step_default = context == LogContext::train_step;
    const bool on_step = o.on_step.value_or(step_default), on_epoch = o.on_epoch.value_or(!step_default);
    if (on_step) {
      // name_step beside an epoch value; else the name itself, not a copy.
      const std::string suffixed = on_epoch ? std::string(name) + "_step" : std::string();
      const std::string_view step_name = on_epoch ? std::string_view(suffixed) : name;
      // Lightning's callback metrics take an evaluation loop's values only
      // once its epoch ends (_ResultCollection.metrics).
      if (training) {
        callback_metrics[step_name] = value;
        if (on_epoch) callback_metrics[name] = value;
      }
      if (o.prog_bar) progress_bar_metrics[step_name] = value;
      // logged_metrics follows every batch, as Lightning's on_batch_end
      // updates it; the loggers get only the due batches' values.
      if (o.logger) {
        logged_metrics[step_name] = value;
        if (step_log_due) pending_step[std::string(step_name)] = value;
      }
    }
    if (on_epoch) {
      auto& acc = (training ? train_accumulators : eval_accumulators)[name];
      const double weight = static_cast<double>(o.batch_size.value_or(current_batch_size > 0 ? current_batch_size : 1));
      switch (o.reduce) {
        case Reduce::mean:
          acc.sum += value * weight;
          acc.weight += weight;
          break;
        case Reduce::sum:
          acc.sum += value;
          break;
        case Reduce::max:
          acc.extreme = acc.any ? std::max(acc.extreme, value) : value;
          break;
        case Reduce::min:
          acc.extreme = acc.any ? std::min(acc.extreme, value) : value;
          break;
      }
      acc.any = true;
      acc.both = on_step;
      acc.options = o;
    }
  }

  // Note [Logged steps]: an evaluation batch's values come with their own
  // step and without the epoch; a training epoch's with theirs.
  void send_to_loggers(std::map<std::string, double> metrics, std::optional<int64_t> step = std::nullopt,
                       bool with_epoch = true) {
    // The sanity check's values reach no logger, and are forgotten after it.
    if (metrics.empty() || sanity) return;
    for (const auto& [k, v] : metrics) logged_metrics[k] = v;
    if (with_epoch) metrics["epoch"] = static_cast<double>(epoch);
    for (auto& logger : loggers) logger->log_metrics(metrics, step.value_or(log_step));
  }

  void record_now(const std::map<std::string, double>& metrics, bool prog_bar, bool logger) {
    for (const auto& [k, v] : metrics) {
      callback_metrics[k] = v;
      if (prog_bar) progress_bar_metrics[k] = v;
    }
    if (logger) send_to_loggers(metrics);
  }

  // Sends the step values logged in the last batch (only a batch whose step
  // log was due records them).
  void flush_step_logs() {
    std::optional<int64_t> eval_step;  // Note [Logged steps]
    if (context == LogContext::eval_step && !sanity) eval_step = eval_log_step++;
    if (pending_step.empty()) return;
    send_to_loggers(pending_step, eval_step, !eval_step);
    pending_step.clear();
  }

  // Writes the epoch values so far into the callback, progress bar and logged
  // metrics, as Lightning's callback_metrics shows them to epoch-end hooks;
  // returns them all, and in `to_log` those for the loggers.
  std::map<std::string, double> refresh(MetricTable<Accumulator>& accumulators,
                                        std::map<std::string, double>* to_log = nullptr) {
    std::map<std::string, double> result;
    for (const auto& [name, acc] : accumulators.map()) {
      if (!acc.any) continue;
      double value = acc.options.reduce == Reduce::mean  ? (acc.weight > 0 ? acc.sum / acc.weight : 0.0)
                     : acc.options.reduce == Reduce::sum ? acc.sum
                                                         : acc.extreme;
      const std::string epoch_name = acc.both ? name + "_epoch" : name;
      callback_metrics[epoch_name] = value;
      if (acc.both) callback_metrics[name] = value;
      if (acc.options.prog_bar) progress_bar_metrics[epoch_name] = value;
      if (acc.options.logger) {
        logged_metrics[epoch_name] = value;
        if (to_log) (*to_log)[epoch_name] = value;
      }
      result[epoch_name] = value;
    }
    return result;
  }

  // The epoch's values, sent to the loggers (at `step`, Note [Logged steps]).
  std::map<std::string, double> aggregate(MetricTable<Accumulator>& accumulators,
                                          std::optional<int64_t> step = std::nullopt) {
    std::map<std::string, double> to_log;
    auto result = refresh(accumulators, &to_log);
    accumulators.clear();
    send_to_loggers(to_log, step);
    return result;
  }

  // ---- Setup ----------------------------------------------------------------
  int64_t resolved_max_epochs() const {
    if (options.fast_dev_run > 0) return 1;
    if (options.max_epochs) return *options.max_epochs;
    return options.max_steps == -1 ? 1000 : -1;
  }

  void begin(const std::string& name) {
    check_options(options);
    accelerator = make_accelerator(options.accelerator);
    auto devices = accelerator->parse_devices(options.devices);
    const auto environment = detect_distributed_environment();
    if (runs_data_parallel(options.strategy, environment)) {
      devices = {data_parallel_device(*accelerator, options.devices, environment)};
      if (!ddp) start_ddp(environment, devices.front());
    } else if (devices.size() != 1) {
      throw ConfigError(fmt::format(
          "devices={} selects {} devices of accelerator '{}', but strategy '{}' runs on one device: use devices=1, "
          "or start one process per device with fulgor-run and strategy 'ddp'",
          options.devices.str(), devices.size(), accelerator->name(), options.strategy));
    }
    precision.setup(options.precision, *accelerator);
    device = devices.front();
    stage = name;
    eval_log_step = 0;
    should_stop = false;
    stop_reason.clear();
    clear_metrics();
    max_epochs = resolved_max_epochs();
  }

  // Lightning's reset_metrics: as a loop begins, and after the sanity check.
  void clear_metrics() {
    callback_metrics.clear();
    progress_bar_metrics.clear();
    logged_metrics.clear();
  }

  // Lightning's _attach_model_callbacks: the module's callbacks replace the
  // Trainer's of the same type, and checkpointing callbacks go last.
  void attach_model_callbacks(ModuleBase& model) {
    auto from_model = model.configure_callbacks();
    if (from_model.empty()) return;
    auto replaced = [&](const Callback& cb) {
      return std::any_of(from_model.begin(), from_model.end(), [&](const auto& m) { return typeid(*m) == typeid(cb); });
    };
    std::vector<std::shared_ptr<Callback>> merged;
    for (auto& cb : callbacks)
      if (!replaced(*cb)) merged.push_back(cb);
    merged.insert(merged.end(), from_model.begin(), from_model.end());
    std::stable_partition(merged.begin(), merged.end(),
                          [](const auto& cb) { return dynamic_cast<ModelCheckpoint*>(cb.get()) == nullptr; });
    callbacks = std::move(merged);
  }

  // Lightning's _call_setup_hook and _call_teardown_hook.
  void setup_hooks(ModuleBase& model, const std::string& name) {
    each_callback([&](Callback& cb) { cb.setup(trainer, model, name); });
    model.setup(name);
  }
  void teardown_hooks(ModuleBase& model, const std::string& name) {
    each_callback([&](Callback& cb) { cb.teardown(trainer, model, name); });
    model.teardown(name);
  }

  // Lightning's _interrupt: the callbacks hear of the exception, and the
  // loggers are finalized as failed.
  void on_exception(ModuleBase& model, const std::exception& e) {
    each_callback([&](Callback& cb) { cb.on_exception(trainer, model, e); });
    for (auto& logger : loggers) logger->finalize("failed");
  }

  // Joins the job. Only rank 0 prints (progress, model summary) and writes logs.
  void start_ddp(const DistributedEnvironment& environment, torch::Device on) {
    accelerator->setup_device(on);
    ProcessGroupOptions group_options;
    if (options.ddp_timeout)
      group_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*options.ddp_timeout * 1000)));
    ddp = std::make_unique<DdpStrategy>(environment, *accelerator, on, group_options);
    if (ddp->is_global_zero()) return;
    callbacks.erase(std::remove_if(callbacks.begin(), callbacks.end(),
                                   [](const auto& cb) {
                                     return dynamic_cast<ProgressBar*>(cb.get()) != nullptr ||
                                            dynamic_cast<ModelSummary*>(cb.get()) != nullptr;
                                   }),
                    callbacks.end());
    for (auto& logger : loggers) logger = silenced_logger(logger);
  }

  // Under ddp every rank must leave the loop at the same batch, or the others
  // would wait in a collective for it: a stop request (EarlyStopping on a
  // rank's own metrics) or a signal that reached some ranks only counts for
  // all. Returns the signal to act on.
  int agree_on_stop(int signal) {
    if (!ddp) return signal;
    const int64_t agreed = ddp->max_over_ranks(static_cast<int64_t>(signal) * 2 + (should_stop ? 1 : 0));
    should_stop = (agreed & 1) != 0 || should_stop;
    return static_cast<int>(agreed / 2);
  }

  void attach(ModuleBase& model) {
    if (options.deterministic) {
      auto& context = at::globalContext();
      deterministic_before.emplace(context.deterministicAlgorithms(), context.deterministicAlgorithmsWarnOnly());
      context.setDeterministicAlgorithms(true, /*warn_only=*/false);
    }
    module = &model;
    accelerator->setup_device(*device);
    if (options.seed) torch::manual_seed(*options.seed);
    accelerator->move_module(model, *device);
    precision.precision().convert_module(model);
    ModuleAccess::attach(model, this, &trainer);
  }

  void end() {
    if (module) ModuleAccess::attach(*module, nullptr, &trainer);
    if (ddp) ddp->detach();
    loop.clear();
    context = LogContext::none;
    if (accelerator) accelerator->teardown();
    if (deterministic_before) {
      at::globalContext().setDeterministicAlgorithms(deterministic_before->first, deterministic_before->second);
      deterministic_before.reset();
    }
  }

  std::optional<int64_t> eval_limit(Stage s, const StepRunner& runner) const {
    if (options.fast_dev_run > 0) return options.fast_dev_run;
    const Limit& limit =
        s == Stage::validate
            ? (options.overfit_batches.of(std::nullopt) != 0 ? options.overfit_batches : options.limit_val_batches)
        : s == Stage::test ? options.limit_test_batches
                           : options.limit_predict_batches;
    return resolve_limit(limit, runner,
                         s == Stage::validate ? "limit_val_batches"
                         : s == Stage::test   ? "limit_test_batches"
                                              : "limit_predict_batches");
  }

  static std::optional<int64_t> resolve_limit(const Limit& limit, const StepRunner& runner, const char* name) {
    auto n = limit.of(runner.length());
    if (!n && !limit.is_all())
      throw ConfigError(
          fmt::format("{}={} is a fraction, but the loader does not tell its length: give a count of "
                      "batches, or make the loader with fulgor::make_data_loader",
                      name, limit.str()));
    return n;
  }

  // ---- Checkpoints ----------------------------------------------------------
  std::string resolve_checkpoint(const std::string& path) const {
    namespace fs = std::filesystem;
    if (path == "best") {
      auto* mc = trainer.checkpoint_callback();
      if (!mc || mc->best_model_path().empty())
        throw CheckpointError("ckpt_path=\"best\": no ModelCheckpoint has saved a best checkpoint in this Trainer");
      return mc->best_model_path();
    }
    if (path != "last") return path;
    const fs::path dir = trainer.checkpoint_dir();
    if (fs::exists(dir / "last.ckpt")) return (dir / "last.ckpt").string();
    std::error_code ec;
    std::optional<fs::path> newest;
    fs::file_time_type newest_time;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() != ".ckpt" || !entry.is_regular_file()) continue;
      auto t = entry.last_write_time();
      if (!newest || t > newest_time) newest = entry.path(), newest_time = t;
    }
    if (!newest) throw CheckpointError(fmt::format("ckpt_path=\"last\": no checkpoint in '{}'", dir.string()));
    return newest->string();
  }

  LoadedCheckpoint read_checkpoint(const std::string& requested) const {
    LoadedCheckpoint ckpt;
    ckpt.path = resolve_checkpoint(requested);
    ckpt.archive = read_checkpoint_file(ckpt.path);
    ckpt.meta = read_checkpoint_meta_from(ckpt.archive, ckpt.path);
    return ckpt;
  }

  static nlohmann::json read_checkpoint_meta_from(torch::serialize::InputArchive& archive, const std::string& path) {
    c10::IValue meta;
    if (!archive.try_read("meta", meta) || !meta.isString())
      throw CheckpointError(fmt::format("checkpoint '{}' has no metadata entry", path));
    detail::JsonInput input = detail::read_json(meta.toStringRef());
    if (!input.error.empty())
      throw CheckpointError(fmt::format("checkpoint '{}' has malformed metadata: {}", path, input.error));
    nlohmann::json& json = input.value;
    if (!json.is_object() || !json.contains("format") || json["format"] != kFormat)
      throw CheckpointError(
          fmt::format("'{}' is not a fulgor training checkpoint (its metadata has no format \"{}\")", path, kFormat));
    if (!json.contains("format_version") || json["format_version"] != kFormatVersion)
      throw CheckpointError(fmt::format("checkpoint '{}' has format version {}; this fulgor reads version {}", path,
                                        detail::json_for_message(json.value("format_version", nlohmann::json())),
                                        kFormatVersion));
    check_metadata(json, path);
    return std::move(json);
  }

  void load_weights(LoadedCheckpoint& ckpt) {
    torch::serialize::InputArchive model_archive;
    if (!ckpt.archive.try_read("model", model_archive))
      throw CheckpointError(fmt::format("checkpoint '{}' has no model state", ckpt.path));
    load_module_state(*module, model_archive, ckpt.path);
  }

  // Lightning's _restore_modules_and_callbacks, after the setup hooks: the
  // module's on_load_checkpoint, its weights, then every callback's
  // on_load_checkpoint and every callback's load_state_dict.
  void restore_module_and_callbacks(LoadedCheckpoint& ckpt) {
    const auto& meta = ckpt.meta;
    restoring(ckpt, "the module's state", [&] { module->on_load_checkpoint(meta.at("module")); });
    load_weights(ckpt);
    for (auto& cb : callbacks)
      restoring(ckpt, fmt::format("what {} reads of it", cb->state_key()),
                [&] { cb->on_load_checkpoint(trainer, *module, meta); });
    const auto& states = meta.at("callbacks");
    for (auto& cb : callbacks)
      if (auto it = states.find(cb->state_key()); it != states.end())
        restoring(ckpt, fmt::format("the state of {}", cb->state_key()), [&] { cb->load_state_dict(*it); });
  }

  // Runs `restore`, which reads `what` from the checkpoint's metadata: an
  // error of the JSON library (a key missing, a value of another type)
  // becomes a CheckpointError naming the file (Note [Checkpoint metadata]).
  template <typename Restore>
  static void restoring(const LoadedCheckpoint& ckpt, const std::string& what, Restore&& restore) {
    try {
      restore();
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(fmt::format("checkpoint '{}': {} does not fit: {}", ckpt.path, what, e.what()));
    }
  }

  // Lightning's restore_training_state, after on_fit_start: the precision's
  // state, the loops' progress, the optimizers and schedulers. The
  // generators are set by restore_rng when the first epoch begins.
  void restore_training_state(LoadedCheckpoint& ckpt) {
    const auto& meta = ckpt.meta;
    precision.load(ckpt.archive, ckpt.path);
    const auto& loop_state = meta.at("loop");
    epoch = loop_state.at("epoch").get<int64_t>();
    global_step = log_step = loop_state.at("global_step").get<int64_t>();
    batches_in_epoch = loop_state.at("batches_in_epoch").get<int64_t>();
    epoch_finished = loop_state.at("epoch_finished").get<bool>();
    total_train_batches = loop_state.at("total_train_batches").get<int64_t>();
    const auto n_optimizers = meta.at("optimizers").get<size_t>();
    if (n_optimizers != optim.optimizers.size())
      throw CheckpointError(fmt::format("checkpoint '{}' holds {} optimizer states; configure_optimizers returned {}",
                                        ckpt.path, n_optimizers, optim.optimizers.size()));
    for (size_t i = 0; i < n_optimizers; ++i) {
      torch::serialize::InputArchive archive;
      try {
        ckpt.archive.read("optimizer_" + std::to_string(i), archive);
        optim.optimizers[i]->load(archive);
      } catch (const c10::Error& e) {
        throw CheckpointError(fmt::format("checkpoint '{}': optimizer {} state does not fit: {}", ckpt.path, i,
                                          e.what_without_backtrace()));
      }
      move_optimizer_state(*optim.optimizers[i], *accelerator, *device);
    }
    const auto& schedulers = meta.at("schedulers");
    if (schedulers.size() != optim.schedulers.size())
      throw CheckpointError(fmt::format("checkpoint '{}' holds {} scheduler states; configure_optimizers returned {}",
                                        ckpt.path, schedulers.size(), optim.schedulers.size()));
    for (size_t i = 0; i < schedulers.size(); ++i)
      restoring(ckpt, fmt::format("the state of scheduler {}", i),
                [&] { optim.schedulers[i].scheduler->load_state_dict(schedulers[i]); });
  }

  void restore_rng(LoadedCheckpoint& ckpt, const char* cpu_key) {
    torch::Tensor state;
    if (ckpt.archive.try_read(cpu_key, state)) set_cpu_rng_state(state);
    torch::Tensor device_state;
    // A device generator's state fits only the generator of the accelerator
    // that saved it: resuming elsewhere (saved on the CPU, resumed on an xpu)
    // leaves the device's generator as it is.
    const bool same_accelerator = ckpt.meta.value("accelerator", std::string()) == accelerator->name();
    if (std::string(cpu_key) == "rng_cpu" && same_accelerator && ckpt.archive.try_read("rng_device", device_state))
      accelerator->set_rng_state(*device, device_state);
  }

  void save_checkpoint(const std::string& path) {
    if (!module) throw Error(fmt::format("save_checkpoint('{}'): this Trainer has not fitted a module", path));
    nlohmann::json meta;
    meta["format"] = kFormat;
    meta["format_version"] = kFormatVersion;
    meta["fulgor_version"] = fulgor::version();
    meta["torch_version"] = TORCH_VERSION;
    meta["accelerator"] = accelerator ? accelerator->name() : "";
    meta["loop"] = {{"epoch", epoch},
                    {"global_step", global_step},
                    {"batches_in_epoch", batches_in_epoch},
                    {"epoch_finished", epoch_finished},
                    {"total_train_batches", total_train_batches}};
    meta["optimizers"] = optim.optimizers.size();
    meta["schedulers"] = nlohmann::json::array();
    for (const auto& s : optim.schedulers) meta["schedulers"].push_back(s.scheduler->state_dict());
    meta["hparams"] = module->hparams();
    meta["module"] = nlohmann::json::object();
    module->on_save_checkpoint(meta["module"]);
    meta["callbacks"] = nlohmann::json::object();
    for (auto& cb : callbacks) {
      auto state = cb->state_dict();
      if (!state.is_null()) meta["callbacks"][cb->state_key()] = state;
      cb->on_save_checkpoint(trainer, *module, meta);
    }
    torch::serialize::OutputArchive archive;
    archive.write("meta", c10::IValue(meta.dump()));
    torch::serialize::OutputArchive model_archive;
    module->save(model_archive);
    archive.write("model", model_archive);
    for (size_t i = 0; i < optim.optimizers.size(); ++i) {
      torch::serialize::OutputArchive o;
      optim.optimizers[i]->save(o);
      archive.write("optimizer_" + std::to_string(i), o);
    }
    archive.write("rng_cpu", cpu_rng_state());
    if (accelerator && device) {
      torch::Tensor device_state = accelerator->get_rng_state(*device);
      if (device_state.defined()) archive.write("rng_device", device_state);
    }
    if (rng_epoch_start.defined()) archive.write("rng_epoch_start", rng_epoch_start);
    precision.save(archive);
    // Every rank loads checkpoints, rank 0 alone writes them; the others wait for the file.
    if (!ddp || ddp->is_global_zero()) write_checkpoint_file(path, archive);
    if (ddp) ddp->barrier();
  }

  // ---- Loops ----------------------------------------------------------------
  double monitored(const SchedulerConfig& config, bool& found) const {
    auto it = callback_metrics.map().find(config.monitor);
    found = it != callback_metrics.map().end();
    if (!found && config.strict) {
      std::vector<std::string> names;
      for (const auto& [k, v] : callback_metrics.map()) names.push_back(k);
      throw ConfigError(fmt::format("the scheduler monitors '{}', which was not logged; logged metrics: {}",
                                    config.monitor,
                                    names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
    }
    return found ? it->second : 0.0;
  }

  void step_schedulers(Interval interval, int64_t count) {
    for (auto& config : optim.schedulers) {
      if (config.interval != interval || count % config.frequency != 0) continue;
      if (config.monitor.empty()) {
        module->lr_scheduler_step(*config.scheduler, std::nullopt);
        continue;
      }
      bool found = false;
      double value = monitored(config, found);
      if (found) module->lr_scheduler_step(*config.scheduler, value);
    }
  }

  // ---- Training -------------------------------------------------------------
  // Note [The optimizer closure]
  // Lightning steps the optimizer with optimizer.step(closure), where the
  // closure runs training_step, zero_grad (on an accumulation window's first
  // batch) and backward; the step then calls on_before_optimizer_step, clips
  // and steps. A batch that does not step runs the closure alone. fulgor
  // keeps that order, the module's optimizer_step deciding when the closure
  // runs. `window` counts the batches whose gradients wait for a step: a
  // training_step returning an undefined loss adds none, and a window without
  // any is not stepped.
  int64_t window = 0;

  [[noreturn]] void throw_bad_loss(const torch::Tensor& loss) const {
    throw ConfigError(fmt::format("{}::training_step must return a scalar loss that requires grad; got shape [{}]{}",
                                  module->name(), fmt::join(loss.sizes(), ", "),
                                  loss.requires_grad() ? "" : " without grad"));
  }

  torch::Tensor run_closure(StepRunner& train, int64_t batch_idx, bool steps_optimizer) {
    std::optional<torch::autograd::DetectAnomalyGuard> anomaly;
    if (FULGOR_UNLIKELY(options.detect_anomaly)) anomaly.emplace();
    // Gradients travel only on the batches that step the optimizer.
    if (FULGOR_UNLIKELY(ddp != nullptr)) ddp->before_forward(steps_optimizer);
    torch::Tensor loss = train.step(Stage::train, batch_idx);
    if (loss.defined() && FULGOR_UNLIKELY(loss.numel() != 1 || !loss.requires_grad())) throw_bad_loss(loss);
    if (batch_idx % options.accumulate_grad_batches == 0) {
      auto& optimizer = *optim.optimizers.front();
      each_callback([&](Callback& cb) { cb.on_before_zero_grad(trainer, *module, optimizer); });
      module->on_before_zero_grad(optimizer);
      module->optimizer_zero_grad(epoch, batch_idx, optimizer);
    }
    if (!loss.defined()) return loss;
    const int64_t accumulate = options.accumulate_grad_batches;
    // The loss itself, not a copy, unless accumulating.
    const torch::Tensor divided =
        FULGOR_UNLIKELY(accumulate > 1) ? loss / static_cast<double>(accumulate) : torch::Tensor();
    const torch::Tensor& scaled = divided.defined() ? divided : loss;
    each_callback([&](Callback& cb) { cb.on_before_backward(trainer, *module, scaled); });
    module->on_before_backward(scaled);
    if (FULGOR_UNLIKELY(ddp != nullptr))
      ddp->backward(precision.scale_loss(scaled));
    else
      precision.backward(scaled);
    each_callback([&](Callback& cb) { cb.on_after_backward(trainer, *module); });
    module->on_after_backward();
    ++window;
    return loss;
  }

  // What optimizer.step does after the closure. False: nothing to step.
  bool step_optimizer() {
    if (window == 0) return false;
    auto& optimizer = *optim.optimizers.front();
    precision.unscale(optimizer);  // clipping and the hooks see true gradients
    each_callback([&](Callback& cb) { cb.on_before_optimizer_step(trainer, *module, optimizer); });
    module->on_before_optimizer_step(optimizer);
    module->configure_gradient_clipping(optimizer, options.gradient_clip_val, options.gradient_clip_algorithm);
    precision.step(optimizer);
    precision.update();
    window = 0;
    return true;
  }

  struct StepClosure final : OptimizerClosure {
    StepClosure(TrainerState& state, StepRunner* runner, int64_t idx) : s(state), train(runner), batch_idx(idx) {}
    void operator()() override {
      if (called) throw Error("optimizer_step called its optimizer_closure twice");
      called = true;
      if (train) loss = s.run_closure(*train, batch_idx, true);
      stepped = s.step_optimizer();
    }
    TrainerState& s;
    StepRunner* train;  // nullptr: the window's batches have run already
    int64_t batch_idx;
    torch::Tensor loss;
    bool called = false, stepped = false;
  };

  // Runs the module's optimizer_step. Note [Skipped steps]: a step the
  // GradScaler skips still counts, and per-step schedulers still step, as in
  // Lightning: global_step counts optimizer steps attempted (as does one
  // whose optimizer_step never called the closure).
  torch::Tensor optimizer_step(StepRunner* train, int64_t batch_idx) {
    StepClosure closure(*this, train, batch_idx);
    module->optimizer_step(epoch, batch_idx, *optim.optimizers.front(), closure);
    if (closure.stepped || !closure.called) {
      ++global_step;
      step_schedulers(Interval::step, global_step);
    }
    return std::move(closure.loss);
  }

  // Lightning's FitLoop.on_advance_end: the non-monitoring callbacks' hook,
  // the module's, then ModelCheckpoint's and EarlyStopping's, seeing the
  // epoch's values; the loggers get them at the epoch's last step label.
  void train_epoch_end(ModuleBase& model, bool complete) {
    loop = "train";
    epoch_finished = true;  // as Lightning's epoch_progress.processed
    refresh(train_accumulators);
    const auto monitoring = [](const Callback& cb) {
      return dynamic_cast<const ModelCheckpoint*>(&cb) != nullptr || dynamic_cast<const EarlyStopping*>(&cb) != nullptr;
    };
    context = LogContext::train_epoch;
    each_callback([&](Callback& cb) {
      if (!monitoring(cb)) cb.on_train_epoch_end(trainer, model);
    });
    model.on_train_epoch_end();
    context = LogContext::none;
    refresh(train_accumulators);
    if (complete) step_schedulers(Interval::epoch, epoch + 1);
    each_callback([&](Callback& cb) {
      if (monitoring(cb)) cb.on_train_epoch_end(trainer, model);
    });
    aggregate(train_accumulators, log_step - 1);  // Note [Logged steps]
  }

  // ---- Evaluation -----------------------------------------------------------
  // An evaluation loop's hooks where it starts, its epoch starts, its epoch
  // ends and it ends; by stage (validate, test, predict).
  struct LoopHook {
    void (Callback::*callback)(Trainer&, ModuleBase&);
    void (ModuleBase::*module)();
  };
  enum EvalPoint { kStart, kEpochStart, kEpochEnd, kEnd };
  void eval_hook(Stage st, EvalPoint point) {
    static const LoopHook hooks[3][4] = {
        {{&Callback::on_validation_start, &ModuleBase::on_validation_start},
         {&Callback::on_validation_epoch_start, &ModuleBase::on_validation_epoch_start},
         {&Callback::on_validation_epoch_end, &ModuleBase::on_validation_epoch_end},
         {&Callback::on_validation_end, &ModuleBase::on_validation_end}},
        {{&Callback::on_test_start, &ModuleBase::on_test_start},
         {&Callback::on_test_epoch_start, &ModuleBase::on_test_epoch_start},
         {&Callback::on_test_epoch_end, &ModuleBase::on_test_epoch_end},
         {&Callback::on_test_end, &ModuleBase::on_test_end}},
        {{&Callback::on_predict_start, &ModuleBase::on_predict_start},
         {&Callback::on_predict_epoch_start, &ModuleBase::on_predict_epoch_start},
         {&Callback::on_predict_epoch_end, &ModuleBase::on_predict_epoch_end},
         {&Callback::on_predict_end, &ModuleBase::on_predict_end}}};
    const LoopHook& hook = hooks[static_cast<int>(st) - 1][point];
    each_callback([&](Callback& cb) { (cb.*hook.callback)(trainer, *module); });
    ((*module).*hook.module)();
  }

  void eval_batch_hook(Stage st, bool start, int64_t i, const torch::Tensor& out) {
    ModuleBase& m = *module;
    switch (st) {
      case Stage::validate:
        if (start) {
          each_callback([&](Callback& cb) { cb.on_validation_batch_start(trainer, m, i); });
          m.on_validation_batch_start(i);
        } else {
          each_callback([&](Callback& cb) { cb.on_validation_batch_end(trainer, m, i); });
          m.on_validation_batch_end(i);
        }
        break;
      case Stage::test:
        if (start) {
          each_callback([&](Callback& cb) { cb.on_test_batch_start(trainer, m, i); });
          m.on_test_batch_start(i);
        } else {
          each_callback([&](Callback& cb) { cb.on_test_batch_end(trainer, m, i); });
          m.on_test_batch_end(i);
        }
        break;
      case Stage::predict:
        if (start) {
          each_callback([&](Callback& cb) { cb.on_predict_batch_start(trainer, m, i); });
          m.on_predict_batch_start(i);
        } else {
          each_callback([&](Callback& cb) { cb.on_predict_batch_end(trainer, m, i); });
          m.on_predict_batch_end(out, i);
        }
        break;
      case Stage::train:
        break;
    }
  }

  void eval_batches(StepRunner& runner, Stage st, std::optional<int64_t> limit, std::vector<torch::Tensor>* outputs) {
    runner.start_epoch();
    for (int64_t i = 0; !limit || i < *limit; ++i) {
      if (!runner.next(true)) break;
      current_batch_size = runner.batch_size();
      context = LogContext::eval_step;
      eval_batch_hook(st, true, i, {});
      torch::Tensor out = runner.step(st, i);
      eval_batch_hook(st, false, i, out);
      if (outputs) outputs->push_back(std::move(out));
      flush_step_logs();
      context = LogContext::none;
    }
  }

  // One run of an evaluation loop (Lightning's _EvaluationLoop.run and
  // _PredictionLoop.run): inside fit, in the sanity check, or on its own.
  // Returns the epoch's values.
  std::map<std::string, double> evaluation_run(StepRunner& runner, Stage st, std::optional<int64_t> limit,
                                               std::vector<torch::Tensor>* outputs = nullptr) {
    const bool was_training = module->is_training();
    const std::string previous_loop = loop;
    loop = sanity ? "sanity_check" : st == Stage::validate ? "validate" : st == Stage::test ? "test" : "predict";
    eval_batches_count = limit;
    eval_accumulators.clear();
    module->eval();
    std::map<std::string, double> result;
    {
      torch::NoGradGuard no_grad;
      eval_hook(st, kStart);
      eval_hook(st, kEpochStart);
      eval_batches(runner, st, limit, outputs);
      refresh(eval_accumulators);
      context = LogContext::eval_epoch;
      eval_hook(st, kEpochEnd);
      context = LogContext::none;
      result = aggregate(eval_accumulators);
      eval_hook(st, kEnd);
    }
    module->train(was_training);
    loop = previous_loop;
    return result;
  }

  std::optional<int64_t> eval_batches_count;
  // Where predict's loop puts predict_step's outputs.
  std::vector<torch::Tensor>* predictions = nullptr;

  // Lightning's _run_sanity_check: a short validation whose values reach no
  // logger and are forgotten afterwards, leaving the generators as it found
  // them so that it changes nothing in training.
  void sanity_check(StepRunner& runner, std::optional<int64_t> limit) {
    const int64_t steps = options.fast_dev_run > 0 ? 0 : options.num_sanity_val_steps;
    if (steps == 0) return;
    torch::Tensor cpu_state = cpu_rng_state(), device_state = accelerator->get_rng_state(*device);
    clear_metrics();
    sanity = true;
    each_callback([&](Callback& cb) { cb.on_sanity_check_start(trainer, *module); });
    if (steps > 0) limit = limit ? std::min(*limit, steps) : steps;
    evaluation_run(runner, Stage::validate, limit);
    each_callback([&](Callback& cb) { cb.on_sanity_check_end(trainer, *module); });
    sanity = false;
    clear_metrics();
    set_cpu_rng_state(cpu_state);
    accelerator->set_rng_state(*device, device_state);
  }

  // Lightning's FitLoop._can_stop_early: a stop waits for min_epochs and
  // min_steps (min_steps alone asks for one epoch, as _parse_loop_limits).
  bool can_stop_early() const {
    const int64_t min_epochs = options.min_epochs.value_or(options.min_steps ? 1 : 0);
    return epoch >= min_epochs && global_step >= options.min_steps.value_or(0);
  }

  void configure_optimizers(ModuleBase& model) {
    optim = model.configure_optimizers();
    if (optim.optimizers.empty() || !optim.optimizers.front())
      throw ConfigError(fmt::format("{}::configure_optimizers returned no optimizer", model.name()));
    // Note [One optimizer]
    // Automatic optimization steps the optimizer with each training_step's
    // loss. Several optimizers are there for parts of a model with objectives
    // of their own (a GAN's generator and discriminator), which one loss
    // stepping them all would ignore; Lightning 2 allows them only under
    // manual optimization, which fulgor does not have yet.
    if (optim.optimizers.size() > 1)
      throw ConfigError(fmt::format(
          "{}::configure_optimizers returned {} optimizers; the Trainer's automatic optimization steps exactly one "
          "with each training_step's loss, and fulgor has no manual optimization: return one optimizer (parameter "
          "groups give parts of the model their own options)",
          model.name(), optim.optimizers.size()));
    for (const auto& sc : optim.schedulers) {
      if (!sc.scheduler) throw ConfigError("configure_optimizers returned a SchedulerConfig without a scheduler");
      if (sc.frequency < 1) throw ConfigError(fmt::format("scheduler frequency={}: expected >= 1", sc.frequency));
      if (sc.scheduler->needs_metric() && sc.monitor.empty())
        throw ConfigError("configure_optimizers returned a scheduler that needs a metric, without `monitor`");
    }
  }
};

}  // namespace detail

using detail::LogContext;
using detail::Stage;

Trainer::Trainer(TrainerOptions options) : state_(std::make_unique<detail::TrainerState>(*this, std::move(options))) {
  auto& s = *state_;
  const auto& o = s.options;
  auto has = [&](auto* probe) {
    using T = std::remove_pointer_t<decltype(probe)>;
    return std::any_of(o.callbacks.begin(), o.callbacks.end(),
                       [](const auto& cb) { return dynamic_cast<T*>(cb.get()) != nullptr; });
  };
  if (o.enable_model_summary && !has(static_cast<ModelSummary*>(nullptr)))
    s.callbacks.push_back(std::make_shared<ModelSummary>());
  if (o.enable_progress_bar && !has(static_cast<ProgressBar*>(nullptr)))
    s.callbacks.push_back(std::make_shared<ProgressBar>());
  // Checkpointing callbacks go last, so that they save what the others did.
  for (const auto& cb : o.callbacks)
    if (!dynamic_cast<ModelCheckpoint*>(cb.get())) s.callbacks.push_back(cb);
  for (const auto& cb : o.callbacks)
    if (dynamic_cast<ModelCheckpoint*>(cb.get())) s.callbacks.push_back(cb);
  if (o.enable_checkpointing && o.fast_dev_run == 0 && !has(static_cast<ModelCheckpoint*>(nullptr)))
    s.callbacks.push_back(std::make_shared<ModelCheckpoint>());
  if (o.fast_dev_run == 0) {
    s.loggers = o.loggers;
    if (s.loggers.empty() && o.logger) s.loggers.push_back(std::make_shared<TensorBoardLogger>(default_root_dir()));
  }
}

Trainer::~Trainer() = default;

FitResult Trainer::run_fit(ModuleBase& model, detail::StepRunner& train, detail::StepRunner* val,
                           const FitOptions& fit_options) {
  auto& s = *state_;
  const auto& o = s.options;
  s.begin("fit");
  // Read the checkpoint before anything is written, so a bad one changes nothing.
  std::optional<detail::LoadedCheckpoint> ckpt;
  if (!fit_options.ckpt_path.empty()) ckpt = s.read_checkpoint(fit_options.ckpt_path);

  struct Scope {
    detail::TrainerState& s;
    ~Scope() { s.end(); }
  } scope{s};

  FitResult result;
  try {
    // Lightning's Trainer._run, in its order.
    s.attach(model);
    s.attach_model_callbacks(model);
    s.setup_hooks(model, "fit");
    if (ckpt) s.restore_module_and_callbacks(*ckpt);
    s.configure_optimizers(model);
    s.epoch = s.global_step = s.log_step = s.batches_in_epoch = s.total_train_batches = 0;
    s.epoch_finished = false;
    s.window = 0;
    s.rng_epoch_start = torch::Tensor();
    if (s.ddp) s.ddp->attach(model);
    detail::SignalTrap trap;
    s.each_callback([&](Callback& cb) { cb.on_fit_start(*this, model); });
    model.on_fit_start();
    for (auto& logger : s.loggers) logger->log_hyperparams(model.hparams());
    if (ckpt) s.restore_training_state(*ckpt);
    train.bind(*s.accelerator, *s.device, s.precision.precision());
    if (val) val->bind(*s.accelerator, *s.device, s.precision.precision());
    // Batches per epoch.
    if (o.fast_dev_run > 0) {
      s.train_batches = train.length() ? std::min(o.fast_dev_run, *train.length()) : o.fast_dev_run;
    } else if (o.overfit_batches.of(std::nullopt) != 0) {
      s.train_batches = detail::TrainerState::resolve_limit(o.overfit_batches, train, "overfit_batches");
      detail::stop_shuffling(train, "training");
      // Note [Overfitting a loader that shuffles]
      train.cache_first(*s.train_batches);
      if (val) detail::stop_shuffling(*val, "validation");
    } else {
      s.train_batches = detail::TrainerState::resolve_limit(o.limit_train_batches, train, "limit_train_batches");
    }
    detail::StepRunner* val_runner = val;
    std::optional<int64_t> val_limit;  // overfit_batches limits it too (eval_limit)
    if (val_runner) val_limit = s.eval_limit(Stage::validate, *val_runner);
    const bool validating = val_runner && val_limit != 0;
    std::optional<int64_t> val_every;  // validate after every N training batches
    const Limit& vci = o.fast_dev_run > 0 ? Limit(1.0) : o.val_check_interval;
    if (validating) {
      if (vci.is_count()) {
        val_every = vci.count();
      } else if (!vci.is_all()) {
        if (!s.train_batches)
          throw ConfigError(
              fmt::format("val_check_interval={} is a fraction, but the training loader does not tell "
                          "its length: give a count of batches, or make the loader with "
                          "fulgor::make_data_loader",
                          vci.str()));
        val_every = std::max<int64_t>(1, static_cast<int64_t>(std::floor(*s.train_batches * vci.fraction())));
      }
    }
    auto validation_due = [&](int64_t done_in_epoch, bool epoch_end) {
      if (!validating) return false;
      if (o.fast_dev_run == 0 && o.check_val_every_n_epoch && (s.epoch + 1) % *o.check_val_every_n_epoch != 0)
        return false;
      if (val_every) {
        if (epoch_end) return false;
        const int64_t counter = o.check_val_every_n_epoch ? done_in_epoch : s.total_train_batches;
        return counter % *val_every == 0;
      }
      // Once per epoch, after its last batch.
      if (s.train_batches) return !epoch_end && done_in_epoch == *s.train_batches;
      return epoch_end;
    };

    model.zero_grad();
    const int64_t max_steps = o.fast_dev_run > 0 ? o.fast_dev_run : o.max_steps;
    // A checkpoint from the middle of an epoch (or any, when training by
    // max_steps) resumes a restarting loop, which skips the sanity check
    // (Lightning's FitLoop.restarting).
    bool resuming_mid_epoch = ckpt && !s.epoch_finished && s.batches_in_epoch > 0;
    const bool restarting = resuming_mid_epoch || (ckpt && max_steps != -1);
    if (validating && !restarting) s.sanity_check(*val_runner, val_limit);

    model.train();
    s.each_callback([&](Callback& cb) { cb.on_train_start(*this, model); });
    model.on_train_start();

    const int64_t accumulate = o.accumulate_grad_batches;
    bool first_after_resume = ckpt.has_value();
    if (ckpt && s.epoch_finished) ++s.epoch;
    result.reason = StopReason::max_epochs;
    torch::Tensor hook_loss;  // Note [The hooks' loss]
    bool stopped = false;
    while (!stopped) {
      if (s.max_epochs != -1 && s.epoch >= s.max_epochs) {
        result.reason = StopReason::max_epochs;
        break;
      }
      if (max_steps != -1 && s.global_step >= max_steps) {
        result.reason = StopReason::max_steps;
        break;
      }
      // A stop asked for before min_epochs or min_steps stands until they are done.
      if (s.should_stop && s.can_stop_early()) {
        result.reason = StopReason::requested;
        break;
      }
      const int64_t skip = resuming_mid_epoch ? s.batches_in_epoch : 0;
      s.epoch_finished = false;
      s.batches_in_epoch = skip;  // a resumed epoch's hooks see the batches done before
      s.window = 0;
      s.loop = "train";
      s.train_accumulators.clear();
      model.train();
      // Lightning does not start again an epoch resumed in its middle.
      if (!resuming_mid_epoch) {
        s.each_callback([&](Callback& cb) { cb.on_train_epoch_start(*this, model); });
        model.on_train_epoch_start();
      }

      // Note [Resuming mid-epoch]
      // A shuffling sampler draws its order from the CPU generator when the
      // epoch begins. The checkpoint holds that generator's state from the
      // epoch's start as well as its current state: the epoch is begun again
      // from the first, the batches already trained on are fetched and
      // dropped, and then the current state is put back.
      if (first_after_resume && resuming_mid_epoch)
        s.restore_rng(*ckpt, "rng_epoch_start");
      else if (first_after_resume)
        s.restore_rng(*ckpt, "rng_cpu");
      s.rng_epoch_start = detail::cpu_rng_state();
      train.set_epoch(s.epoch);  // Note [Loader epochs] in trainer.h
      train.start_epoch();
      bool exhausted = false;
      // A checkpoint may count more batches than this loader has.
      for (int64_t i = 0; i < skip && !exhausted; ++i)
        if (!train.next(false)) exhausted = true;
      if (first_after_resume && resuming_mid_epoch) s.restore_rng(*ckpt, "rng_cpu");
      first_after_resume = resuming_mid_epoch = false;

      bool broke_early = false, skipped_rest = false;
      while (!exhausted) {
        if (s.train_batches && s.batches_in_epoch >= *s.train_batches) break;
        if (!train.next(true)) {
          exhausted = true;
          break;
        }
        const int64_t batch_idx = s.batches_in_epoch;
        // The epoch's last batch steps the optimizer even mid-window.
        const bool last = s.train_batches && batch_idx + 1 == *s.train_batches;
        s.current_batch_size = train.batch_size();
        s.context = LogContext::train_step;
        const bool steps_optimizer = (batch_idx + 1) % accumulate == 0 || last;
        s.step_log_due = steps_optimizer && ((s.global_step + 1) % o.log_every_n_steps == 0 || s.should_stop);
        s.each_callback([&](Callback& cb) { cb.on_train_batch_start(*this, model, batch_idx); });
        if (FULGOR_UNLIKELY(model.on_train_batch_start(batch_idx) == -1)) {
          s.context = LogContext::none;
          s.step_log_due = true;
          skipped_rest = true;
          break;
        }
        // Note [The optimizer closure]
        const torch::Tensor loss =
            steps_optimizer ? s.optimizer_step(&train, batch_idx) : s.run_closure(train, batch_idx, false);
        s.batches_in_epoch = batch_idx + 1;
        ++s.total_train_batches;
        // Note [The hooks' loss]
        if (loss.defined())
          detail::refill_graph_free(hook_loss, loss);
        else
          hook_loss.reset();
        s.each_callback([&](Callback& cb) { cb.on_train_batch_end(*this, model, hook_loss, batch_idx); });
        model.on_train_batch_end(hook_loss, batch_idx);
        s.flush_step_logs();
        s.context = LogContext::none;
        s.step_log_due = true;

        if (FULGOR_UNLIKELY(validation_due(s.batches_in_epoch, false)))
          s.evaluation_run(*val_runner, Stage::validate, val_limit);
        s.log_step = s.global_step;
        if (int sig = s.agree_on_stop(detail::SignalTrap::pending()); FULGOR_UNLIKELY(sig != 0)) {
          result.reason = StopReason::signal;
          result.message = fmt::format("stopped by signal {} ({})", sig, sig == SIGINT ? "SIGINT" : "SIGTERM");
          result.checkpoint_path = (std::filesystem::path(checkpoint_dir()) / "last.ckpt").string();
          s.save_checkpoint(result.checkpoint_path);
          stopped = true;
          break;
        }
        if (FULGOR_UNLIKELY(max_steps != -1 && s.global_step >= max_steps)) {
          broke_early = !(s.train_batches && s.batches_in_epoch == *s.train_batches);
          if (broke_early) result.reason = StopReason::max_steps;
          break;
        }
        if (FULGOR_UNLIKELY(s.should_stop && s.can_stop_early())) {
          broke_early = !(s.train_batches && s.batches_in_epoch == *s.train_batches);
          if (broke_early) result.reason = StopReason::requested;
          break;
        }
      }
      if (stopped) break;
      // A loader that does not tell its length ends a window unannounced:
      // its gradients are stepped now.
      if (exhausted && s.window > 0) {
        if (s.ddp) s.ddp->reduce_gradients();
        s.optimizer_step(nullptr, s.batches_in_epoch - 1);
      }
      s.window = 0;
      s.log_step = s.global_step;
      const bool complete = !broke_early;
      if (complete && !skipped_rest && validation_due(s.batches_in_epoch, true))
        s.evaluation_run(*val_runner, Stage::validate, val_limit);
      s.train_epoch_end(model, complete);
      s.agree_on_stop(0);
      // Between epochs the state is "at the start of the next one"; an epoch
      // that a stop cut short counts as done, as Lightning's epoch progress.
      ++s.epoch;
      s.batches_in_epoch = 0;
      s.epoch_finished = false;
      if (!complete) break;
    }
    if (result.message.empty()) {
      switch (result.reason) {
        case StopReason::max_epochs:
          result.message = fmt::format("max_epochs={} reached", s.max_epochs);
          break;
        case StopReason::max_steps:
          result.message = fmt::format("max_steps={} reached", max_steps);
          break;
        case StopReason::requested:
          result.message = s.stop_reason.empty() ? "stop requested" : s.stop_reason;
          break;
        case StopReason::signal:
          break;
      }
    }
    s.loop.clear();
    s.each_callback([&](Callback& cb) { cb.on_train_end(*this, model); });
    model.on_train_end();
    s.each_callback([&](Callback& cb) { cb.on_fit_end(*this, model); });
    model.on_fit_end();
    s.teardown_hooks(model, "fit");
    for (auto& logger : s.loggers) logger->finalize(result.reason == StopReason::signal ? "interrupted" : "success");
  } catch (const std::exception& e) {
    s.on_exception(model, e);
    throw;
  }
  result.epochs_completed = s.epoch;
  result.global_step = s.global_step;
  return result;
}

// Lightning's _run for validate, test and predict.
std::map<std::string, double> Trainer::run_eval(Stage stage, ModuleBase& model, detail::StepRunner& runner,
                                                const EvalOptions& eval_options) {
  auto& s = *state_;
  const std::string name = stage == Stage::validate ? "validate" : stage == Stage::test ? "test" : "predict";
  s.begin(name);
  std::optional<detail::LoadedCheckpoint> ckpt;
  if (!eval_options.ckpt_path.empty()) ckpt = s.read_checkpoint(eval_options.ckpt_path);
  struct Scope {
    detail::TrainerState& s;
    ~Scope() { s.end(); }
  } scope{s};
  std::map<std::string, double> result;
  try {
    s.attach(model);
    s.attach_model_callbacks(model);
    s.setup_hooks(model, name);
    if (ckpt) s.restore_module_and_callbacks(*ckpt);
    runner.bind(*s.accelerator, *s.device, s.precision.precision());
    const auto limit = s.eval_limit(stage, runner);
    model.zero_grad();
    result = s.evaluation_run(runner, stage, limit, s.predictions);
    s.teardown_hooks(model, name);
    for (auto& logger : s.loggers) logger->finalize("success");
  } catch (const std::exception& e) {
    s.on_exception(model, e);
    throw;
  }
  return result;
}

std::vector<torch::Tensor> Trainer::run_predict(ModuleBase& model, detail::StepRunner& runner,
                                                const EvalOptions& eval_options) {
  std::vector<torch::Tensor> outputs;
  state_->predictions = &outputs;
  struct Reset {
    detail::TrainerState& s;
    ~Reset() { s.predictions = nullptr; }
  } reset{*state_};
  run_eval(Stage::predict, model, runner, eval_options);
  return outputs;
}

// ---- Accessors ----------------------------------------------------------------

const TrainerOptions& Trainer::options() const { return state_->options; }
int64_t Trainer::current_epoch() const { return state_->epoch; }
int64_t Trainer::global_step() const { return state_->global_step; }
int64_t Trainer::batches_in_epoch() const { return state_->batches_in_epoch; }
std::optional<int64_t> Trainer::num_training_batches() const { return state_->train_batches; }
std::optional<int64_t> Trainer::num_eval_batches() const { return state_->eval_batches_count; }
int64_t Trainer::max_epochs() const { return state_->max_epochs; }
std::string Trainer::stage() const { return state_->stage; }
std::string Trainer::running_loop() const { return state_->loop; }
bool Trainer::sanity_checking() const { return state_->sanity; }

void Trainer::request_stop(std::string reason) {
  state_->should_stop = true;
  state_->stop_reason = std::move(reason);
}
bool Trainer::should_stop() const { return state_->should_stop; }
const std::string& Trainer::stop_reason() const { return state_->stop_reason; }
bool Trainer::logs_due() const { return state_->step_log_due; }

const std::map<std::string, double>& Trainer::callback_metrics() const { return state_->callback_metrics.map(); }
const std::map<std::string, double>& Trainer::logged_metrics() const { return state_->logged_metrics.map(); }
const std::map<std::string, double>& Trainer::progress_bar_metrics() const {
  return state_->progress_bar_metrics.map();
}
void Trainer::log_metrics(const std::map<std::string, double>& metrics) { state_->send_to_loggers(metrics); }

const std::vector<std::shared_ptr<Callback>>& Trainer::callbacks() const { return state_->callbacks; }
const std::vector<std::shared_ptr<Logger>>& Trainer::loggers() const { return state_->loggers; }
ModelCheckpoint* Trainer::checkpoint_callback() const {
  for (const auto& cb : state_->callbacks)
    if (auto* mc = dynamic_cast<ModelCheckpoint*>(cb.get())) return mc;
  return nullptr;
}
const std::vector<std::shared_ptr<torch::optim::Optimizer>>& Trainer::optimizers() const {
  return state_->optim.optimizers;
}
const std::vector<SchedulerConfig>& Trainer::lr_schedulers() const { return state_->optim.schedulers; }

const Accelerator& Trainer::accelerator() const {
  if (!state_->accelerator) throw Error("the Trainer has not run a loop yet, so it has no accelerator");
  return *state_->accelerator;
}
torch::Device Trainer::device() const {
  if (!state_->device) throw Error("the Trainer has not run a loop yet, so it has no device");
  return *state_->device;
}

const Precision& Trainer::precision() const { return state_->precision.precision(); }
const GradScaler* Trainer::grad_scaler() const { return state_->precision.scaler(); }
int64_t Trainer::global_rank() const { return state_->ddp ? state_->ddp->environment().rank : 0; }
int64_t Trainer::world_size() const { return state_->ddp ? state_->ddp->environment().world_size : 1; }
bool Trainer::is_global_zero() const { return global_rank() == 0; }

bool Trainer::reduce_boolean_decision(bool decision, bool all) {
  if (!state_->ddp) return decision;
  // All: no rank says no, so the largest "no" is 0.
  if (all) return state_->ddp->max_over_ranks(decision ? 0 : 1) == 0;
  return state_->ddp->max_over_ranks(decision ? 1 : 0) == 1;
}

std::string Trainer::default_root_dir() const {
  return state_->options.default_root_dir.empty() ? "." : state_->options.default_root_dir;
}

std::string Trainer::checkpoint_dir() const {
  if (auto* mc = checkpoint_callback(); mc && !mc->dirpath().empty()) return mc->dirpath();
  return (std::filesystem::path(default_root_dir()) / "checkpoints").string();
}

std::string Trainer::log_dir() const {
  if (!state_->loggers.empty() && !state_->loggers.front()->log_dir().empty())
    return state_->loggers.front()->log_dir();
  return default_root_dir();
}

void Trainer::save_checkpoint(const std::string& path) { state_->save_checkpoint(path); }

}  // namespace fulgor
