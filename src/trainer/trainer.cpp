#include "fulgor/trainer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>

#include "fulgor/distributed/strategy.h"
#include "fulgor/loggers/tensorboard.h"
#include "trainer/callback_connector.h"
#include "trainer/state.h"

namespace fulgor {

Trainer::Trainer(TrainerOptions options) : state_(std::make_unique<detail::TrainerState>(*this, std::move(options))) {
  auto& s = *state_;
  const auto& o = s.options;
  s.callbacks = detail::configure_callbacks(o);
  if (o.fast_dev_run == 0) {
    s.loggers = o.loggers;
    if (s.loggers.empty() && o.logger) s.loggers.push_back(std::make_shared<TensorBoardLogger>(default_root_dir()));
  }
}

Trainer::~Trainer() = default;

// ---- Accessors ----------------------------------------------------------------

const TrainerOptions& Trainer::options() const { return state_->options; }
int64_t Trainer::current_epoch() const { return state_->fit_loop.current_epoch(); }
int64_t Trainer::global_step() const { return state_->fit_loop.epoch_loop.global_step; }
int64_t Trainer::batches_in_epoch() const { return state_->fit_loop.epoch_loop.batch_progress.current.processed; }
std::optional<int64_t> Trainer::num_training_batches() const { return state_->fit_loop.num_training_batches; }
std::optional<int64_t> Trainer::num_eval_batches() const {
  const auto* loop = state_->running_inference();
  return loop ? loop->batches_this_run : std::nullopt;
}
std::optional<int64_t> Trainer::num_val_batches() const {
  return (state_->stage == "validate" ? state_->validate_loop : state_->fit_loop.epoch_loop.val_loop).max_batches;
}
int64_t Trainer::accumulate_grad_batches() const { return state_->accumulate_grad_batches; }
void Trainer::set_accumulate_grad_batches(int64_t batches) {
  if (batches < 1) throw ConfigError(fmt::format("accumulate_grad_batches={}: expected an integer >= 1", batches));
  state_->accumulate_grad_batches = batches;
}
int64_t Trainer::max_epochs() const { return state_->limits.max_epochs; }
int64_t Trainer::max_steps() const { return state_->limits.max_steps; }
int64_t Trainer::min_epochs() const { return state_->limits.min_epochs; }
int64_t Trainer::num_sanity_val_steps() const { return state_->limits.num_sanity_val_steps; }
std::optional<int64_t> Trainer::check_val_every_n_epoch() const { return state_->limits.check_val_every_n_epoch; }
int64_t Trainer::reload_dataloaders_every_n_epochs() const { return state_->options.reload_dataloaders_every_n_epochs; }
int64_t Trainer::num_nodes() const { return state_->options.num_nodes; }
bool Trainer::barebones() const { return state_->options.barebones; }
std::optional<int64_t> Trainer::val_check_batch() const {
  const auto& loop = state_->fit_loop.epoch_loop;
  return loop.has_schedule() ? loop.schedule().val_check_batch() : std::nullopt;
}
const Limit& Trainer::limit_train_batches() const { return state_->limits.limit_train_batches; }
const Limit& Trainer::limit_val_batches() const { return state_->limits.limit_val_batches; }
const Limit& Trainer::limit_test_batches() const { return state_->limits.limit_test_batches; }
const Limit& Trainer::limit_predict_batches() const { return state_->limits.limit_predict_batches; }
std::string Trainer::stage() const { return state_->stage; }
std::string Trainer::running_loop() const {
  switch (state_->running) {
    case detail::RunningStage::training:
      return "train";
    case detail::RunningStage::sanity_checking:
      return "sanity_check";
    case detail::RunningStage::validating:
      return "validate";
    case detail::RunningStage::testing:
      return "test";
    case detail::RunningStage::predicting:
      return "predict";
    case detail::RunningStage::none:
      break;
  }
  return "";
}
bool Trainer::sanity_checking() const { return state_->sanity_checking(); }

void Trainer::request_stop(std::string reason) {
  state_->should_stop = true;
  state_->stop_reason = std::move(reason);
}
bool Trainer::should_stop() const { return state_->should_stop; }
const std::string& Trainer::stop_reason() const { return state_->stop_reason; }
bool Trainer::logs_due() const { return state_->metrics.step_log_due; }

const std::map<std::string, double>& Trainer::callback_metrics() const {
  state_->metrics.read_deferred();
  return state_->metrics.callback_metrics.map();
}
const std::map<std::string, double>& Trainer::logged_metrics() const {
  state_->metrics.read_deferred();
  return state_->metrics.logged_metrics.map();
}
const std::map<std::string, double>& Trainer::progress_bar_metrics() const {
  state_->metrics.read_deferred();
  return state_->metrics.progress_bar_metrics.map();
}
void Trainer::log_metrics(const std::map<std::string, double>& metrics) { state_->metrics.send_to_loggers(metrics); }

const std::vector<std::shared_ptr<Callback>>& Trainer::callbacks() const { return state_->callbacks; }
const std::vector<std::shared_ptr<Logger>>& Trainer::loggers() const { return state_->loggers; }
DataModuleBase* Trainer::datamodule() const { return state_->datamodule; }

ModelCheckpoint* Trainer::checkpoint_callback() const { return detail::find_model_checkpoint(state_->callbacks); }
const std::vector<std::shared_ptr<torch::optim::Optimizer>>& Trainer::optimizers() const {
  return state_->optim.optimizers;
}
const std::vector<SchedulerConfig>& Trainer::lr_schedulers() const { return state_->optim.schedulers; }

const Accelerator& Trainer::accelerator() const {
  if (!state_->accelerator) throw Error("the Trainer has not run a loop yet, so it has no accelerator");
  return *state_->accelerator;
}
torch::Device Trainer::device() const {
  if (!state_->device_setup) throw Error("the Trainer has not run a loop yet, so it has no device");
  return state_->device_setup->device;
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
  if (std::string dirpath = detail::checkpoint_dirpath(checkpoint_callback()); !dirpath.empty()) return dirpath;
  return (std::filesystem::path(default_root_dir()) / "checkpoints").string();
}

std::string Trainer::log_dir() const {
  if (!state_->loggers.empty() && !state_->loggers.front()->log_dir().empty())
    return state_->loggers.front()->log_dir();
  return default_root_dir();
}

void Trainer::save_checkpoint(const std::string& path) {
  detail::ProfileScope timed(state_->hooks.stage("save_checkpoint"));
  state_->checkpoints.save(path);
}

void Trainer::save_checkpoint_async(const std::string& path, std::function<void()> on_written) {
  detail::ProfileScope timed(state_->hooks.stage("save_checkpoint"));
  if (state_->options.async_checkpointing) return state_->checkpoints.save_async(path, std::move(on_written));
  state_->checkpoints.save(path);
  if (on_written) on_written();
}

void Trainer::wait_for_checkpoint() { state_->checkpoints.wait_for_write(); }

const SimpleProfiler* Trainer::profiler() const { return state_->profiling ? &state_->profiling->profiler() : nullptr; }

}  // namespace fulgor
