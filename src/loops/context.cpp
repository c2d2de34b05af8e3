#include "loops/context.h"

#include <fmt/format.h>

#include <iostream>
#include <utility>

#include "fulgor/core/error.h"
#include "fulgor/distributed/strategy.h"

namespace fulgor::detail {

LoopContext::LoopContext(Trainer& owner, TrainerOptions opts) : trainer(owner), options(std::move(opts)) {}
LoopContext::~LoopContext() = default;

namespace {
Limit debug_limit(const TrainerOptions& o, const Limit& limit) {
  return o.fast_dev_run > 0 ? Limit(o.fast_dev_run) : limit;
}
}  // namespace

LoopLimits::LoopLimits(const TrainerOptions& o)
    : max_epochs(o.fast_dev_run > 0  ? 1
                 : o.max_epochs      ? *o.max_epochs
                 : o.max_steps == -1 ? 1000
                                     : -1),
      max_steps(o.fast_dev_run > 0 ? o.fast_dev_run : o.max_steps),
      // min_steps alone asks for one epoch, as Lightning's _parse_loop_limits.
      min_epochs(o.min_epochs.value_or(o.min_steps ? 1 : 0)),
      min_steps(o.min_steps),
      num_sanity_val_steps(o.fast_dev_run > 0 ? 0 : o.num_sanity_val_steps),
      limit_test_batches(debug_limit(o, o.limit_test_batches)),
      limit_predict_batches(debug_limit(o, o.limit_predict_batches)),
      val_check_interval(o.fast_dev_run > 0 ? Limit(1.0) : o.val_check_interval),
      check_val_every_n_epoch(o.fast_dev_run > 0 ? std::optional<int64_t>(1) : o.check_val_every_n_epoch),
      overfit(o.fast_dev_run == 0 && o.overfit_batches.of(std::nullopt) != 0) {
  limit_train_batches = debug_limit(o, overfit ? o.overfit_batches : o.limit_train_batches);
  limit_val_batches = debug_limit(o, overfit ? o.overfit_batches : o.limit_val_batches);
}

bool LoopContext::is_global_zero() const { return !ddp || ddp->is_global_zero(); }

void LoopContext::info(const std::string& message) const {
  if (is_global_zero()) std::cout << message << std::endl;
}

void LoopContext::warn(const std::string& message) const {
  if (is_global_zero()) std::cerr << message << std::endl;
}

void LoopContext::warn_once(const std::string& message) {
  if (said_once.insert(message).second) warn(message);
}

void LoopContext::info_once(const std::string& message) {
  if (said_once.insert(message).second) info(message);
}

// Under ddp every rank must leave the loop at the same batch, or the others
// would wait in a collective for it: a stop request (EarlyStopping on a
// rank's own metrics) or a signal that reached some ranks only counts for
// all. Returns the signal to act on.
int LoopContext::agree_on_stop(int signal) {
  if (!ddp) return signal;
  const int64_t agreed = ddp->max_over_ranks(static_cast<int64_t>(signal) * 2 + (should_stop ? 1 : 0));
  should_stop = (agreed & 1) != 0 || should_stop;
  return static_cast<int>(agreed / 2);
}

namespace {
const char* stage_loader_name(Stage which) {
  return which == Stage::train      ? "train_loader"
         : which == Stage::validate ? "val_loader"
         : which == Stage::test     ? "test_loader"
                                    : "predict_loader";
}
const char* stage_loop_name(Stage which) {
  return which == Stage::train      ? "training"
         : which == Stage::validate ? "validation"
         : which == Stage::test     ? "test"
                                    : "prediction";
}
}  // namespace

// Note [Distributed sampling]
// Lightning's use_distributed_sampler: under ddp each rank reads its own shard
// of a loader, so that the job reads the data set once per epoch rather than
// once per rank. The Trainer asks every loader as each loop starts
// (distribute, Note [The loader protocol]): the training loader evenly, padded
// by repeating samples, since every training step is a collective that all
// ranks must reach; the evaluation and prediction loaders without repeating
// any sample, so that each sample counts once in the epoch's values (the ranks
// then run up to one batch apart, which is why nothing in evaluation is a
// per-batch collective: sync_dist reduces epoch values once, at the epoch's
// end, Note [Epoch values over the ranks] in metric_store.cpp). Lightning pads
// evaluation shards too, counting some samples twice. A loader that cannot be
// sharded (no distribute member, or its sampler is the user's) is read as it
// is. Outside ddp the loaders are asked to read everything again, which undoes
// the shard of an earlier ddp loop at the cost of a no-op otherwise.
void LoopContext::distribute(StepRunner& runner, bool even) {
  if (!options.use_distributed_sampler) return;
  DistributedShard shard;
  if (ddp) {
    shard.num_replicas = ddp->environment().world_size;
    shard.rank = ddp->environment().rank;
  }
  shard.even = even;
  runner.distribute(shard);
}

// Lightning's has_len_all_ranks warns likewise: a loop over an empty loader
// runs no step, which otherwise passes without a word (an epoch of no
// training steps, a validation mean over nothing).
void LoopContext::warn_if_empty(const StepRunner& runner, Stage which) const {
  if (runner.length() != 0) return;
  const bool sharded = ddp && options.use_distributed_sampler && ddp->environment().world_size > 1;
  warn(fmt::format("The {} has no batches{}: the {} loop runs no step. Please make sure this was your intention.",
                   stage_loader_name(which), sharded ? fmt::format(" on rank {}", ddp->environment().rank) : "",
                   stage_loop_name(which)));
}

std::optional<int64_t> LoopContext::resolve_limit(const Limit& limit, const StepRunner& runner, const char* name) {
  auto n = limit.of(runner.length());
  if (!n && !limit.is_all())
    throw ConfigError(
        fmt::format("{}={} is a fraction, but the loader does not tell its length: give a count of "
                    "batches, or make the loader with fulgor::make_data_loader",
                    name, limit.str()));
  return n;
}

void LoopContext::open_loader(StepRunner& runner, Stage which) {
  if (!runner.open()) no_loader(runner, which);
}

void LoopContext::no_loader(const StepRunner& runner, Stage which) const {
  const char* loader = stage_loader_name(which);
  throw ConfigError(fmt::format("{}::{} returned no loader: {} must override it", runner.source_name(), loader,
                                datamodule ? fmt::format("a data module given to {}", stage)
                                           : fmt::format("a module given to {} without loaders", stage)));
}

}  // namespace fulgor::detail
