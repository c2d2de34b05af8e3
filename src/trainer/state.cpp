#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <typeinfo>

#include "config/option_names.h"
#include "detail/demangle.h"
#include "distributed/launcher.h"
#include "fulgor/config/seed.h"
#include "fulgor/core/registry.h"
#include "fulgor/distributed/strategy.h"
#include "fulgor/distributed/sync_batchnorm.h"
#include "loops/module_access.h"
#include "trainer/state.h"

namespace fulgor::detail {

namespace {

// Lightning's barebones opt-outs: what a user leaves on by default is
// turned off. (Lightning refuses an opt-out passed as on; here their
// defaults are on, so only what must be refused is: check_barebones.)
TrainerOptions resolve_barebones(TrainerOptions o) {
  if (!o.barebones) return o;
  o.enable_checkpointing = false;
  o.logger = false;
  o.enable_progress_bar = false;
  o.enable_model_summary = false;
  o.num_sanity_val_steps = 0;
  return o;
}

// A class's name without its namespace, as Python's __class__.__name__.
std::string class_name(const std::type_info& type) {
  const std::string name = demangle(type.name());
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

// Lightning's refusals under barebones of what the options cannot turn off:
// a logger given (Trainer.__init__), a checkpointing or progress-bar
// callback (its callback connector, with the flags off).
void check_barebones(const TrainerOptions& o) {
  if (!o.barebones) return;
  if (!o.loggers.empty()) {
    std::vector<std::string> names;
    for (const auto& logger : o.loggers) names.push_back(class_name(typeid(*logger)));
    throw ConfigError(
        fmt::format("`Trainer(barebones=True, logger=[{}])` was passed. Logging can impact raw speed so "
                    "it is disabled in barebones mode.",
                    fmt::join(names, ", ")));
  }
  for (const auto& cb : o.callbacks) {
    const char* option = cb->saves_checkpoints() ? "enable_checkpointing"
                         : cb->shows_progress()  ? "enable_progress_bar"
                                                 : nullptr;
    if (option)
      throw ConfigError(fmt::format("Trainer was configured with `{}=False` but found `{}` in callbacks list.", option,
                                    class_name(typeid(*cb))));
  }
}

}  // namespace

TrainerState::TrainerState(Trainer& owner, TrainerOptions opts)
    : LoopContext(owner, resolve_barebones(std::move(opts))) {
  // Made with the Trainer, as Lightning's, so that its report's Total is the
  // time since then; an unknown name is reported when a loop begins.
  if (names_simple_profiler(options.profiler))
    profiling = std::make_unique<Profiling>(
        std::make_unique<SimpleProfiler>(options.profiler_dirpath, options.profiler_filename));
}
TrainerState::~TrainerState() = default;

std::string TrainerState::checkpoint_dir() const { return trainer.checkpoint_dir(); }

const InferenceLoop* TrainerState::running_inference() const {
  switch (running) {
    case RunningStage::sanity_checking:
      return &fit_loop.epoch_loop.val_loop;
    case RunningStage::validating:
      return stage == "fit" ? &fit_loop.epoch_loop.val_loop : &validate_loop;
    case RunningStage::testing:
      return &test_loop;
    case RunningStage::predicting:
      return &predict_loop;
    default:
      return nullptr;
  }
}

void TrainerState::begin(const std::string& name) {
  check_options(options);
  check_barebones(options);
  accelerator = make_accelerator(options.accelerator);
  const auto devices = accelerator->parse_devices(options.devices);
  auto environment = detect_distributed_environment();
  check_job_size(options.devices, devices.size(), options.num_nodes, environment);
  if (launches_ranks(options.strategy, environment, *accelerator, options.devices, devices.size()))
    environment = launch_ranks(static_cast<int64_t>(devices.size()));
  const DeviceSetup setup = detail::device_setup(*accelerator, options.devices, devices, environment);
  if (runs_data_parallel(options.strategy, environment) && !ddp) start_ddp(environment, setup);
  precision.setup(options.precision, *accelerator);
  device_setup = setup;
  stage = name;
  if (profiling) profiling->forget_owners();
  metrics.eval_log_step = 0;
  should_stop = false;
  stop_reason.clear();
  said_once.clear();
  metrics.clear();
  if (options.barebones) announce_barebones();
}

// Lightning's messages: once for the Trainer, then as each loop starts.
void TrainerState::announce_barebones() {
  if (!barebones_announced)
    info(
        "You are running in `Trainer(barebones=True)` mode. All features that may impact raw speed have been "
        "disabled to facilitate analyzing the Trainer overhead. Specifically, the following features are "
        "deactivated:\n - Checkpointing: `Trainer(enable_checkpointing=True)`\n - Progress bar: "
        "`Trainer(enable_progress_bar=True)`\n - Model summary: `Trainer(enable_model_summary=True)`\n - Logging: "
        "`Trainer(logger=True)`, `Trainer(log_every_n_steps>0)`, `LightningModule.log(...)`, "
        "`LightningModule.log_dict(...)`\n - Sanity checking: `Trainer(num_sanity_val_steps>0)`\n - Development "
        "run: `Trainer(fast_dev_run=True)`\n - Anomaly detection: `Trainer(detect_anomaly=True)`\n - Profiling: "
        "`Trainer(profiler=...)`");
  barebones_announced = true;
  info(
      "`Trainer(barebones=True)` started running. The progress bar is disabled so you might want to manually print "
      "the progress in your model.");
}

// Lightning's _run up to configure_model: the device, the module on it, the
// module's callbacks merged, the data prepared and the setup hooks.
void TrainerState::launch(ModuleBase& model) {
  if (options.deterministic) {
    auto& context = at::globalContext();
    deterministic_before.emplace(context.deterministicAlgorithms(), context.deterministicAlgorithmsWarnOnly());
    context.setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  set_benchmark();
  module = &model;
  accelerator->setup_device(*device_setup);
  if (options.seed) seed_accelerator(*accelerator, *options.seed);
  place_module(model);
  ModuleAccess::attach(model, &metrics, &trainer, &optim);
  attach_model_callbacks(model);
  setup_hooks(model);
  configure_model(model);
}

// Lightning's _call_configure_model; the strategy then moves what it made.
void TrainerState::configure_model(ModuleBase& model) {
  hooks.module("configure_model", [&] { model.configure_model(); });
  place_module(model);
}

// Lightning's _set_torch_flags: `benchmark`, false under `deterministic`
// unless given, and otherwise left as it is; set for the process, as
// Lightning sets torch.backends.cudnn.benchmark.
void TrainerState::set_benchmark() {
  std::optional<bool> benchmark = options.benchmark;
  if (options.deterministic && !benchmark) benchmark = false;
  if (options.deterministic && options.benchmark.value_or(false))
    warn(
        "You passed `deterministic=True` and `benchmark=True`. Note that PyTorch ignores "
        "torch.backends.cudnn.deterministic=True when torch.backends.cudnn.benchmark=True.");
  if (benchmark) accelerator->set_benchmark(*benchmark);
}

// The module onto the device, in the precision's type.
void TrainerState::place_module(ModuleBase& model) {
  accelerator->move_module(model, device_setup->device);
  precision.precision().convert_module(model);
}

void TrainerState::end() {
  if (module) {
    ModuleAccess::attach(*module, nullptr, &trainer, &optim);
    manual_optimization.attach(*module, false);
  }
  if (ddp) ddp->detach();
  if (module) ModuleAccess::set_sharded_gradient_norm(*module, nullptr);
  if (GradScaler* scaler = precision.scaler()) scaler->set_found_inf_reduction(nullptr);
  if (module && options.sync_batchnorm) revert_sync_batchnorm(*module);
  running = RunningStage::none;
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
  auto from_model = hooks.module("configure_callbacks", [&] { return model.configure_callbacks(); });
  if (from_model.empty()) return;
  auto replaced = [&](const Callback& cb) {
    return std::any_of(from_model.begin(), from_model.end(), [&](const auto& m) { return typeid(*m) == typeid(cb); });
  };
  std::vector<std::shared_ptr<Callback>> merged;
  for (auto& cb : callbacks)
    if (!replaced(*cb)) merged.push_back(cb);
  merged.insert(merged.end(), from_model.begin(), from_model.end());
  std::stable_partition(merged.begin(), merged.end(), [](const auto& cb) { return !cb->saves_checkpoints(); });
  callbacks = std::move(merged);
}

// Lightning's _call_setup_hook and _call_teardown_hook.
void TrainerState::setup_hooks(ModuleBase& model) {
  // One process per node (or per job) prepares the data; the others wait
  // for it in the barrier before setup.
  const int64_t local_rank = ddp ? ddp->environment().local_rank : 0;
  const int64_t node_rank = ddp ? ddp->environment().node_rank : 0;
  const auto prepares = [&](bool per_node) { return local_rank == 0 && (per_node || node_rank == 0); };
  if (datamodule) {
    DataModuleAccess::attach(*datamodule, &trainer);
    if (prepares(datamodule->prepare_data_per_node())) datamodule->prepare_data();
  }
  if (prepares(model.prepare_data_per_node())) hooks.module("prepare_data", [&] { model.prepare_data(); });
  if (ddp) ddp->barrier();
  if (datamodule) datamodule->setup(stage);
  hooks.callbacks(model).setup(stage);
  hooks.module("setup", [&] { model.setup(stage); });
}

void TrainerState::finish(ModuleBase& model, const std::string& status) {
  if (datamodule) datamodule->teardown(stage);
  hooks.callbacks(model).teardown(stage);
  hooks.module("teardown", [&] { model.teardown(stage); });
  for (auto& logger : loggers) logger->finalize(status);
  describe_profile();
}

// Lightning's _interrupt: the callbacks hear of the exception, and the
// loggers are finalized as failed.
void TrainerState::on_exception(ModuleBase& model, const std::exception& e) {
  hooks.callbacks(model).on_exception(e);
  for (auto& logger : loggers) logger->finalize("failed");
}

// Lightning's DDPStrategy.setup and FSDPStrategy.setup, after
// configure_optimizers: the gradients synchronized, and under sharding the
// optimizers put on the shards.
void TrainerState::attach_ddp(ModuleBase& model) {
  ddp->attach(model, precision.precision());
  ddp->shard(optim.optimizers);
  if (ddp->sharding() == Sharding::none) return;
  ModuleAccess::set_sharded_gradient_norm(model, [strategy = ddp.get()](const std::vector<torch::Tensor>& params) {
    return strategy->gradient_norm(params);
  });
  if (GradScaler* scaler = precision.scaler()) scaler->set_found_inf_reduction(summed_over(ddp->group()));
}

// Joins the job. Only rank 0 prints (progress, model summary) and writes logs.
void TrainerState::start_ddp(const DistributedEnvironment& environment, const DeviceSetup& setup) {
  accelerator->setup_device(setup);
  ddp = join_ddp(environment, *accelerator, setup.device, options.ddp_timeout,
                 sharding_of(options.strategy, options.sharding_strategy, options.zero_redundancy_optimizer));
  silence_off_rank_zero(loggers, environment);
  if (ddp->is_global_zero()) return;
  callbacks.erase(std::remove_if(callbacks.begin(), callbacks.end(),
                                 [](const auto& cb) { return cb->shows_progress() || cb->summarizes_model(); }),
                  callbacks.end());
}

void TrainerState::describe_profile() {
  if (!profiling) return;
  const bool distributed = trainer.world_size() > 1;
  profiling->profiler().describe(stage, trainer.log_dir(),
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

void TrainerState::configure_optimizers(ModuleBase& model) {
  optim = hooks.module("configure_optimizers", [&] { return model.configure_optimizers(); });
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
