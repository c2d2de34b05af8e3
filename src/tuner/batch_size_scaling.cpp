// The batch-size search: Lightning's tuner/batch_size_scaling.py and
// callbacks/batch_size_finder.py.

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <tuple>
#include <utility>

#include "fulgor/callbacks/batch_size_finder.h"
#include "fulgor/core/error.h"
#include "fulgor/data_module.h"
#include "fulgor/module.h"
#include "fulgor/trainer.h"
#include "tuner/sweep.h"

namespace fulgor {

namespace {

// Lightning's lightning_getattr and lightning_setattr, over hparams(): the
// value is the data module's where both hold one, and a new value goes to
// both.
class BatchSizeArgument {
 public:
  BatchSizeArgument(ModuleBase& module, DataModuleBase* datamodule, std::string name)
      : module_(module), datamodule_(datamodule), name_(std::move(name)) {}

  bool found() const { return holds(module_) || (datamodule_ && holds(*datamodule_)); }
  int64_t get() const {
    const auto& hparams = datamodule_ && holds(*datamodule_) ? datamodule_->hparams() : module_.hparams();
    return hparams.at(name_).get<int64_t>();
  }
  void set(int64_t size) const {
    set_in(module_, size);
    if (datamodule_) set_in(*datamodule_, size);
  }

 private:
  template <typename Holder>
  bool holds(const Holder& holder) const {
    return holder.hparams().is_object() && holder.hparams().contains(name_);
  }
  template <typename Holder>
  void set_in(Holder& holder, int64_t size) const {
    if (!holds(holder)) return;
    nlohmann::json hparams = holder.hparams();
    hparams[name_] = size;
    holder.save_hyperparameters(std::move(hparams));
  }

  ModuleBase& module_;
  DataModuleBase* datamodule_;
  std::string name_;
};

// Lightning's _run_power_scaling and _run_binsearch_scaling over the fit
// loop, each trial steps_per_trial steps from a fresh count.
class BatchSizeSearch {
 public:
  BatchSizeSearch(detail::TrainerState& s, const ScaleBatchSizeOptions& o, const BatchSizeArgument& argument,
                  std::vector<BatchSizeTrial>& trials)
      : s(s), o(o), argument_(argument), trials_(trials) {}

  int64_t run() {
    const int64_t size = adjust(1.0, o.init_val, nullptr).first;
    return o.mode == "power" ? power(size) : binsearch(size);
  }

 private:
  // Lightning's _adjust_batch_size: the size `value`, or the current one
  // times `factor`, capped at max_val; unchanged where the loader made at the
  // current size holds the whole data set.
  std::pair<int64_t, bool> adjust(double factor, std::optional<int64_t> value, const char* desc) {
    const int64_t batch_size = argument_.get();
    s.fit_loop.setup_data();
    if (const auto batches = s.fit_loop.train_runner()->length(); batches && *batches <= 1) {
      s.info(fmt::format("The batch size {} is greater or equal than the length of your dataset.", batch_size));
      return {batch_size, false};
    }
    int64_t new_size = value ? *value : static_cast<int64_t>(static_cast<double>(batch_size) * factor);
    if (new_size > o.max_val) {
      if (desc)
        s.info(fmt::format("Batch size {} exceeds max_val limit {}, capping at {}", new_size, o.max_val, o.max_val));
      new_size = o.max_val;
    }
    if (desc) s.info(fmt::format("Batch size {} {}, trying batch size {}", batch_size, desc, new_size));
    argument_.set(new_size);
    return {new_size, new_size != batch_size};
  }

  // Lightning's _reset_progress and _try_loop_run: whether `size` fitted.
  bool trial(int64_t size) {
    auto& loop = s.fit_loop;
    loop.epoch_progress = {};
    loop.epoch_loop.batch_progress = {};
    loop.epoch_loop.global_step = loop.epoch_loop.batches_that_stepped = 0;
    s.should_stop = false;
    try {
      loop.run();
    } catch (const std::exception& e) {
      if (!s.accelerator->is_out_of_memory(e)) throw;
      trials_.push_back({size, false});
      return false;
    }
    trials_.push_back({size, true});
    return true;
  }

  bool at_max_val(int64_t size) const {
    if (size < o.max_val) return false;
    s.info(fmt::format("Reached the maximum batch size limit of {}. Stopping search.", o.max_val));
    return true;
  }

  int64_t power(int64_t new_size) {
    bool any_success = false;
    for (int64_t i = 0; i < o.max_trials && !at_max_val(new_size); ++i) {
      if (!trial(new_size)) {
        new_size = adjust(0.5, std::nullopt, "failed").first;
        if (any_success) break;
        continue;
      }
      if (i + 1 >= o.max_trials) break;
      bool changed = false;
      std::tie(new_size, changed) = adjust(2.0, std::nullopt, "succeeded");
      if (!changed) break;
      any_success = true;
    }
    return new_size;
  }

  int64_t binsearch(int64_t new_size) {
    int64_t low = 1, count = 0;
    std::optional<int64_t> high;
    while (!at_max_val(new_size)) {
      if (!trial(new_size)) {
        high = new_size;
        new_size = adjust(1.0, (*high + low) / 2, "failed").first;
        if (*high - low <= 1) break;
        continue;
      }
      if (++count >= o.max_trials) break;
      low = new_size;
      if (high && *high - low <= 1) break;
      bool changed = false;
      std::tie(new_size, changed) =
          high ? adjust(1.0, (*high + low) / 2, "succeeded") : adjust(2.0, std::nullopt, "succeeded");
      if (!changed) break;
    }
    const int64_t reduced = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(new_size) * (1 - o.margin)));
    if (o.margin > 0 && reduced != new_size) {
      s.info(fmt::format("Applying margin of {:.1f}%, reducing batch size from {} to {}", o.margin * 100, new_size,
                         reduced));
      new_size = reduced;
      argument_.set(new_size);
    }
    return new_size;
  }

  detail::TrainerState& s;
  const ScaleBatchSizeOptions& o;
  const BatchSizeArgument& argument_;
  std::vector<BatchSizeTrial>& trials_;
};

// Lightning's BatchSizeFinder.setup checks, once the fit knows its loader.
void check_scalable(const detail::TrainerState& s, const BatchSizeArgument& argument, const std::string& name) {
  if (s.ddp) throw ConfigError("BatchSizeFinder: the batch size finder is not supported with distributed strategies");
  if (s.fit_loop.train_runner()->source_name().empty())
    throw ConfigError(
        "BatchSizeFinder: the batch size finder cannot be used with loaders given to fit: make the loader in the "
        "module's or a data module's train_loader(), at the size in hparams()");
  if (!argument.found())
    throw ConfigError(fmt::format(
        "BatchSizeFinder: batch_arg_name=\"{}\" is in neither the module's hparams() nor the data module's: save the "
        "batch size there with save_hyperparameters, or name the key that holds it",
        name));
}

}  // namespace

BatchSizeFinder::BatchSizeFinder(ScaleBatchSizeOptions options) : options_(std::move(options)) {
  auto& mode = options_.mode;
  std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::tolower(c); });
  if (mode != "power" && mode != "binsearch")
    throw ConfigError(fmt::format("BatchSizeFinder: mode \"{}\": expected \"power\" or \"binsearch\"", mode));
  if (!(options_.margin >= 0.0 && options_.margin < 1.0))
    throw ConfigError(fmt::format("BatchSizeFinder: margin={}: expected a fraction in [0, 1)", options_.margin));
  for (const auto& [name, value] : {std::pair{"steps_per_trial", options_.steps_per_trial},
                                    {"init_val", options_.init_val},
                                    {"max_trials", options_.max_trials},
                                    {"max_val", options_.max_val}})
    if (value < 1) throw ConfigError(fmt::format("BatchSizeFinder: {}={}: expected at least 1", name, value));
  optimal_ = options_.init_val;
}

void BatchSizeFinder::on_fit_start(Trainer& trainer, ModuleBase& module) { scale_batch_size(trainer, module); }

void BatchSizeFinder::scale_batch_size(Trainer& trainer, ModuleBase& module) {
  auto& s = detail::TrainerAccess::state(trainer);
  trials_.clear();
  if (s.options.fast_dev_run > 0) {
    s.warn("Skipping batch size scaler since `fast_dev_run` is enabled.");
    optimal_.reset();
  } else {
    const BatchSizeArgument argument(module, s.datamodule, options_.batch_arg_name);
    check_scalable(s, argument, options_.batch_arg_name);
    detail::SweepScope scope(s, "scale_batch_size", {});
    s.limits.limit_train_batches = Limit(1.0);
    s.limits.limit_val_batches = Limit(options_.steps_per_trial);
    s.limits.max_steps = options_.steps_per_trial;
    int64_t found = 0;
    detail::run_sweep(scope, [&] { found = BatchSizeSearch(s, options_, argument, trials_).run(); });
    s.info(fmt::format("Finished batch size finder, will continue with full run using batch size {}", found));
    optimal_ = found;
  }
  if (early_exit_) throw detail::TunerExit{};
}

}  // namespace fulgor
