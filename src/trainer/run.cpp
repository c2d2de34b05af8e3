// fit, validate, test and predict: Lightning's Trainer._run and _run_stage
// around the loops of src/loops/.

#include <fmt/format.h>
#include <torch/torch.h>

#include <optional>

#include "distributed/launcher.h"
#include "fulgor/core/error.h"
#include "fulgor/distributed/strategy.h"
#include "fulgor/distributed/sync_batchnorm.h"
#include "loops/signals.h"
#include "trainer/state.h"

namespace fulgor {

using detail::Stage;

namespace {

// Ends a loop's use of the Trainer's state, also when it throws.
struct EndScope {
  detail::TrainerState& s;
  ~EndScope() { s.end(); }
};

// Rank 0 of a job it started cannot go on, nor can the other ranks (Note [The
// Trainer's own launcher]). A collective that failed names the rank whose end
// made it fail.
void stop_job(const std::exception& e) {
  const std::string failure =
      dynamic_cast<const DistributedError*>(&e) ? detail::launched_rank_failure(/*wait_seconds=*/2.0) : "";
  detail::stop_launched_ranks();
  if (!failure.empty()) throw DistributedError(fmt::format("{}; the cause: {}", e.what(), failure));
}

// Lightning's _run around one stage ("fit", "validate", ...): the options,
// accelerator and strategy; the checkpoint at `ckpt_path` (none when "last"
// finds none) read before anything is written, so that a bad one changes
// nothing; the module launched and the checkpoint's weights and callback
// states restored. `stage` then runs with
// the checkpoint (nullptr: none); an exception reaches the callbacks and the
// loggers before it goes on.
template <typename Stage>
void run_stage(detail::TrainerState& s, const char* name, ModuleBase& model, DataModuleBase* datamodule,
               const std::string& ckpt_path, Stage&& stage) {
  s.begin(name);
  s.datamodule = datamodule;
  std::optional<detail::LoadedCheckpoint> ckpt;
  if (const std::string path = s.checkpoints.resolve(ckpt_path); !path.empty()) ckpt = s.checkpoints.read(path);
  EndScope scope{s};
  try {
    s.launch(model);
    if (ckpt) s.checkpoints.restore_module_and_callbacks(*ckpt);
    stage(ckpt ? &*ckpt : nullptr);
  } catch (const detail::TunerExit&) {
    s.finish(model, "success");
    throw;
  } catch (const std::exception& e) {
    // The write in flight completes before the callbacks hear of the
    // exception; its own failure is reported, the exception goes on.
    if (const std::string failed = s.checkpoints.wait_for_write_quietly(); !failed.empty()) s.warn(failed);
    s.on_exception(model, e);
    if (detail::launched_ranks()) stop_job(e);
    throw;
  }
}

}  // namespace

FitResult Trainer::run_fit(ModuleBase& model, detail::StepRunner& train, detail::StepRunner* val,
                           const FitOptions& fit_options, DataModuleBase* datamodule) {
  auto& s = *state_;
  run_stage(s, "fit", model, datamodule, fit_options.ckpt_path, [&](detail::LoadedCheckpoint* ckpt) {
    // Lightning's DDPStrategy.setup: the layer sync (sync_batchnorm) changes a
    // fit's module before the optimizers take its parameters; end() reverts it.
    if (s.ddp && s.options.sync_batchnorm) convert_sync_batchnorm(model);
    s.configure_optimizers(model);
    s.checkpoints.check_sharded_saves();
    s.manual_optimization.attach(model, true);
    s.fit_loop.reset_for_fit(train, val);
    s.metrics.log_step = 0;
    if (s.ddp) s.attach_ddp(model);
    detail::SignalTrap trap;
    s.hooks.both("on_fit_start", &Callback::on_fit_start, &ModuleBase::on_fit_start);
    const nlohmann::json hparams = s.logged_hparams(model);
    for (auto& logger : s.loggers) logger->log_hyperparams(hparams);
    if (ckpt) s.checkpoints.restore_training_state(*ckpt);
    // Lightning's _run_stage: the sanity check (skipped by a fit that
    // restarts), then the fit loop.
    model.zero_grad();
    if (!s.fit_loop.restarting()) s.fit_loop.epoch_loop.val_loop.sanity_check();
    s.fit_loop.run();
    s.checkpoints.wait_for_write();
    // FULL_SHARD: the module whole again for on_fit_end and what follows.
    if (s.ddp) s.ddp->unshard();
    s.hooks.both("on_fit_end", &Callback::on_fit_end, &ModuleBase::on_fit_end);
    s.finish(model, s.fit_loop.stopped_by_signal() ? "interrupted" : "success");
  });
  return s.fit_loop.result();
}

std::map<std::string, double> Trainer::run_eval(Stage stage, ModuleBase& model, detail::StepRunner& runner,
                                                const EvalOptions& eval_options, std::vector<torch::Tensor>* outputs,
                                                DataModuleBase* datamodule) {
  auto& s = *state_;
  const char* name = stage == Stage::validate ? "validate" : stage == Stage::test ? "test" : "predict";
  std::map<std::string, double> result;
  run_stage(s, name, model, datamodule, eval_options.ckpt_path, [&](detail::LoadedCheckpoint*) {
    detail::InferenceLoop& loop = stage == Stage::validate ? static_cast<detail::InferenceLoop&>(s.validate_loop)
                                  : stage == Stage::test   ? static_cast<detail::InferenceLoop&>(s.test_loop)
                                                           : s.predict_loop;
    loop.use(&runner);
    if (!loop.setup_data()) s.no_loader(runner, stage);
    model.zero_grad();
    if (stage == Stage::predict)
      *outputs = s.predict_loop.run();
    else
      result = static_cast<detail::EvaluationLoop&>(loop).run();
    s.finish(model, "success");
  });
  return result;
}

}  // namespace fulgor
