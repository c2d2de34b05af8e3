#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <typeinfo>

#include "fulgor/callbacks/model_checkpoint.h"
#include "fulgor/callbacks/model_summary.h"
#include "fulgor/callbacks/progress_bar.h"
#include "fulgor/registry.h"
#include "fulgor/seed.h"
#include "fulgor/strategy.h"
#include "module_access.h"
#include "state.h"

namespace fulgor::detail {

TrainerState::TrainerState(Trainer& owner, TrainerOptions opts) : trainer(owner), options(std::move(opts)) {
  // Made with the Trainer, as Lightning's, so that its report's Total is the
  // time since then; an unknown name is reported when a loop begins.
  if (names_simple_profiler(options.profiler))
    profiling = std::make_unique<Profiling>(
        std::make_unique<SimpleProfiler>(options.profiler_dirpath, options.profiler_filename));
}
TrainerState::~TrainerState() = default;

int64_t TrainerState::resolved_max_epochs() const {
  if (options.fast_dev_run > 0) return 1;
  if (options.max_epochs) return *options.max_epochs;
  return options.max_steps == -1 ? 1000 : -1;
}

void TrainerState::begin(const std::string& name) {
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
  if (profiling) profiling->forget_owners();
  metrics.eval_log_step = 0;
  should_stop = false;
  stop_reason.clear();
  metrics.clear();
  max_epochs = resolved_max_epochs();
}

void TrainerState::attach(ModuleBase& model) {
  if (options.deterministic) {
    auto& context = at::globalContext();
    deterministic_before.emplace(context.deterministicAlgorithms(), context.deterministicAlgorithmsWarnOnly());
    context.setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  module = &model;
  accelerator->setup_device(*device);
  if (options.seed) seed_accelerator(*accelerator, *options.seed);
  accelerator->move_module(model, *device);
  precision.precision().convert_module(model);
  ModuleAccess::attach(model, &metrics, &trainer);
}

void TrainerState::end() {
  if (module) {
    ModuleAccess::attach(*module, nullptr, &trainer);
    manual_optimization.attach(*module, false);
  }
  if (ddp) ddp->detach();
  loop.clear();
  metrics.context = LogContext::none;
  if (accelerator) accelerator->teardown();
  if (deterministic_before) {
    at::globalContext().setDeterministicAlgorithms(deterministic_before->first, deterministic_before->second);
    deterministic_before.reset();
  }
}

// Lightning's _attach_model_callbacks: the module's callbacks replace the
// Trainer's of the same type, and checkpointing callbacks go last.
void TrainerState::attach_model_callbacks(ModuleBase& model) {
  auto from_model = call_module("configure_callbacks", [&] { return model.configure_callbacks(); });
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
void TrainerState::setup_hooks(ModuleBase& model, const std::string& name) {
  // One process per node (or per job) prepares the data; the others wait
  // for it in the barrier before setup.
  const int64_t local_rank = ddp ? ddp->environment().local_rank : 0;
  const int64_t node_rank = ddp ? ddp->environment().node_rank : 0;
  const auto prepares = [&](bool per_node) { return local_rank == 0 && (per_node || node_rank == 0); };
  if (datamodule) {
    DataModuleAccess::attach(*datamodule, &trainer);
    if (prepares(datamodule->prepare_data_per_node())) datamodule->prepare_data();
  }
  if (prepares(model.prepare_data_per_node())) call_module("prepare_data", [&] { model.prepare_data(); });
  if (ddp) ddp->barrier();
  if (datamodule) datamodule->setup(name);
  each_callback("setup", [&](Callback& cb) { cb.setup(trainer, model, name); });
  call_module("setup", [&] { model.setup(name); });
}

void TrainerState::teardown_hooks(ModuleBase& model, const std::string& name) {
  if (datamodule) datamodule->teardown(name);
  each_callback("teardown", [&](Callback& cb) { cb.teardown(trainer, model, name); });
  call_module("teardown", [&] { model.teardown(name); });
}

// Lightning's _interrupt: the callbacks hear of the exception, and the
// loggers are finalized as failed.
void TrainerState::on_exception(ModuleBase& model, const std::exception& e) {
  each_callback("on_exception", [&](Callback& cb) { cb.on_exception(trainer, model, e); });
  for (auto& logger : loggers) logger->finalize("failed");
}

// Joins the job. Only rank 0 prints (progress, model summary) and writes logs.
void TrainerState::start_ddp(const DistributedEnvironment& environment, torch::Device on) {
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
int TrainerState::agree_on_stop(int signal) {
  if (!ddp) return signal;
  const int64_t agreed = ddp->max_over_ranks(static_cast<int64_t>(signal) * 2 + (should_stop ? 1 : 0));
  should_stop = (agreed & 1) != 0 || should_stop;
  return static_cast<int>(agreed / 2);
}

std::optional<int64_t> TrainerState::eval_limit(Stage s, const StepRunner& runner) const {
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

std::optional<int64_t> TrainerState::resolve_limit(const Limit& limit, const StepRunner& runner, const char* name) {
  auto n = limit.of(runner.length());
  if (!n && !limit.is_all())
    throw ConfigError(
        fmt::format("{}={} is a fraction, but the loader does not tell its length: give a count of "
                    "batches, or make the loader with fulgor::make_data_loader",
                    name, limit.str()));
  return n;
}

void TrainerState::describe_profile(const std::string& name) {
  if (!profiling) return;
  const bool distributed = trainer.world_size() > 1;
  profiling->profiler().describe(name, trainer.log_dir(),
                                 distributed ? std::optional<int64_t>(ddp->environment().local_rank) : std::nullopt,
                                 trainer.is_global_zero());
}

nlohmann::json TrainerState::logged_hparams(const ModuleBase& model) const {
  nlohmann::json hparams = model.hparams();
  if (!datamodule || datamodule->hparams().empty()) return hparams;
  if (!hparams.is_object() || !datamodule->hparams().is_object())
    return hparams.empty() ? datamodule->hparams() : hparams;
  std::vector<std::string> inconsistent;
  for (const auto& [key, value] : datamodule->hparams().items()) {
    if (auto it = hparams.find(key); it != hparams.end() && *it != value) inconsistent.push_back(key);
    hparams[key] = value;
  }
  if (!inconsistent.empty())
    throw ConfigError(fmt::format(
        "the hyper-parameters {} are in both {}'s and {}'s hparams, with different values: give them one value",
        fmt::join(inconsistent, ", "), model.name(), datamodule->name()));
  return hparams;
}

void TrainerState::open_loader(StepRunner& runner, Stage which) {
  if (runner.open()) return;
  const char* loader = which == Stage::train      ? "train_loader"
                       : which == Stage::validate ? "val_loader"
                       : which == Stage::test     ? "test_loader"
                                                  : "predict_loader";
  throw ConfigError(fmt::format("{}::{} returned no loader: a data module given to {} must override it",
                                datamodule ? datamodule->name() : std::string("the data module"), loader, stage));
}

void TrainerState::configure_optimizers(ModuleBase& model) {
  optim = call_module("configure_optimizers", [&] { return model.configure_optimizers(); });
  if (optim.optimizers.empty() ||
      std::any_of(optim.optimizers.begin(), optim.optimizers.end(), [](const auto& o) { return o == nullptr; }))
    throw ConfigError(fmt::format("{}::configure_optimizers returned {}", model.name(),
                                  optim.optimizers.empty() ? "no optimizer" : "a null optimizer"));
  manual = !model.automatic_optimization();
  manual_optimization.check(model);
  for (const auto& sc : optim.schedulers) {
    if (!sc.scheduler) throw ConfigError("configure_optimizers returned a SchedulerConfig without a scheduler");
    if (sc.frequency < 1) throw ConfigError(fmt::format("scheduler frequency={}: expected >= 1", sc.frequency));
    if (std::none_of(optim.optimizers.begin(), optim.optimizers.end(),
                     [&](const auto& o) { return o.get() == &sc.scheduler->optimizer(); }))
      throw ConfigError(fmt::format(
          "{}::configure_optimizers returned a scheduler attached to an optimizer it did not return", model.name()));
    // Under manual optimization the module steps its schedulers, with any metric.
    if (!manual && sc.scheduler->needs_metric() && sc.monitor.empty())
      throw ConfigError("configure_optimizers returned a scheduler that needs a metric, without `monitor`");
  }
}

}  // namespace fulgor::detail
