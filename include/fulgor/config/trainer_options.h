#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/core/devices.h"
#include "fulgor/core/export.h"

namespace fulgor {

class Callback;
class Logger;

/// A number of batches given either as a count or as a fraction of a loader's
/// batches, as Lightning's `limit_train_batches=10` (count) and `=0.25`
/// (fraction). An integer is a count, a floating-point number a fraction:
/// `Limit(1)` is one batch, `Limit(1.0)` all of them.
///
/// Requires: a count >= 0, a fraction in [0, 1] (checked where it is used,
/// with a ConfigError naming the option).
class FULGOR_API Limit {
 public:
  Limit() = default;  ///< all batches
  Limit(int count) : count_(count) {}
  Limit(int64_t count) : count_(count) {}
  Limit(double fraction) : fraction_(fraction) {}

  bool is_count() const { return count_.has_value(); }
  int64_t count() const { return count_.value_or(0); }
  double fraction() const { return fraction_; }
  /// Whether the limit lets every batch through (the fraction 1.0).
  bool is_all() const { return !count_ && fraction_ == 1.0; }

  /// The number of batches out of `total` (nullopt: unknown). A count is
  /// returned as is (capped at a known total); a fraction of an unknown total
  /// is nullopt unless it is 1.0 (all) or 0.0 (none).
  std::optional<int64_t> of(std::optional<int64_t> total) const;

  /// The value as a user would type it: `3` or `0.5`.
  std::string str() const;

  friend bool operator==(const Limit& a, const Limit& b) {
    return a.count_ == b.count_ && (a.count_ || a.fraction_ == b.fraction_);
  }
  friend bool operator!=(const Limit& a, const Limit& b) { return !(a == b); }

 private:
  std::optional<int64_t> count_;
  double fraction_ = 1.0;
};

/// Everything a Trainer can be told, with PyTorch Lightning's names, defaults
/// and meanings. A plain aggregate: C++20 code writes
/// `fulgor::Trainer trainer({.accelerator = "cpu", .max_epochs = 5});`.
///
/// Options convert to and from JSON (to_json/from_json below; callbacks and
/// loggers are objects and stay out of JSON), and parse_command_line fills them
/// from `--trainer.<name>=<value>` arguments. The Trainer checks the values
/// when a loop starts and throws ConfigError naming the option.
struct FULGOR_API TrainerOptions {
  /// A registered accelerator, "auto" (highest priority available) or "gpu".
  std::string accelerator = "auto";
  /// "auto", "single_device", "ddp" (one process per device, started by
  /// fulgor-run, torchrun or srun; "auto" is "ddp" under such a launcher) or
  /// "fsdp" (ddp's processes, with the optimizers' state, the gradients and
  /// the parameters sharded over the ranks: sharding_strategy;
  /// docs/distributed.md).
  std::string strategy = "auto";
  /// Under strategy "fsdp", what is sharded, by Lightning's (and PyTorch
  /// FSDP's) names, in any case: "FULL_SHARD" (ZeRO-3, Lightning's default:
  /// the gradients, the optimizers' state and the parameters of the module's
  /// fulgor::Sharded units, gathered only for their passes; the parameters
  /// outside every unit stay whole), "SHARD_GRAD_OP" (the gradients and the
  /// optimizers' state, ZeRO-2), "NO_SHARD" (nothing: ddp) or
  /// "HYBRID_SHARD" (FULL_SHARD over the ranks of each node, every node
  /// holding the same pieces: collectives within nodes but for one
  /// all_reduce of the reduced gradients across them; num_nodes nodes of
  /// consecutive ranks).
  std::string sharding_strategy = "FULL_SHARD";
  /// Under strategy "ddp", the optimizers' state sharded over the ranks
  /// (ZeRO-1, as PyTorch's ZeroRedundancyOptimizer): each rank steps its
  /// piece of every parameter and the pieces are gathered after each step.
  bool zero_redundancy_optimizer = false;
  /// What the fit's checkpoints are, by Lightning's FSDP names: "full" (a
  /// file holding the whole state, which rank 0 gathers and writes) or
  /// "sharded" (a folder in PyTorch's distributed-checkpoint layout, which
  /// every rank writes its part of, nothing gathered; its optimizers must be
  /// SGD, Adam or AdamW: docs/distributed.md). Under any strategy; a fit
  /// resumes from either, at any number of ranks.
  std::string state_dict_type = "full";
  Devices devices = "auto";
  /// The machines of a ddp job. Under a launcher (torchrun, fulgor-run,
  /// srun) it must be the launcher's: its world size over the processes of
  /// this node; a job started without one runs on one node.
  int64_t num_nodes = 1;
  /// "32-true" ("32"), "64-true" ("64"), "bf16-mixed" ("bf16"), "16-mixed" ("16"),
  /// "bf16-true" or "16-true", as the accelerator supports (see docs/precision.md).
  std::string precision = "32-true";
  /// Whether to add the default TensorBoardLogger (under default_root_dir) when
  /// `loggers` is empty.
  bool logger = true;
  std::vector<std::shared_ptr<Logger>> loggers;
  std::vector<std::shared_ptr<Callback>> callbacks;
  /// Runs N batches (true: 1) of training, validation and test in one epoch,
  /// with no sanity check, checkpoints or loggers: a smoke test of the code.
  int64_t fast_dev_run = 0;
  /// Stops after this many epochs; unset means 1000 when max_steps is -1 and
  /// unlimited otherwise, -1 means unlimited.
  std::optional<int64_t> max_epochs;
  /// Training completes at least this many epochs even when asked to stop;
  /// a stop asked for earlier takes effect once they are done.
  std::optional<int64_t> min_epochs;
  /// Stops after this many optimizer steps; -1 is unlimited.
  int64_t max_steps = -1;
  /// Training takes at least this many optimizer steps even when asked to
  /// stop (and, with min_epochs unset, completes one epoch).
  std::optional<int64_t> min_steps;
  Limit limit_train_batches = 1.0;
  Limit limit_val_batches = 1.0;
  Limit limit_test_batches = 1.0;
  Limit limit_predict_batches = 1.0;
  /// Trains on this many batches of the training loader, the same ones every
  /// epoch, and validates on as many of the validation loader's (0: off). A
  /// TensorLoader's shuffling is turned off, for good (with a warning), as
  /// Lightning does; another loader's first batches are kept and replayed.
  Limit overfit_batches = 0.0;
  /// How often to validate within an epoch: a fraction of the epoch or every
  /// N training batches.
  Limit val_check_interval = 1.0;
  /// Validates every N epochs (unset: only as val_check_interval says).
  std::optional<int64_t> check_val_every_n_epoch = 1;
  /// Asks the module or data module for the training and validation loaders
  /// again every N epochs of a fit (0: once per fit); loaders given to fit
  /// are the same objects each time.
  int64_t reload_dataloaders_every_n_epochs = 0;
  /// Validation batches run before training to catch bugs early (-1: all).
  int64_t num_sanity_val_steps = 2;
  /// Loggers receive step metrics every N training batches.
  int64_t log_every_n_steps = 50;
  /// Adds a default ModelCheckpoint when none is among `callbacks`.
  bool enable_checkpointing = true;
  /// Off (the default, as Lightning's): a ModelCheckpoint save is on disk
  /// (written, fsynced, renamed, the file it displaces removed) when the hook
  /// that saved it returns. On: the save pauses training only to copy the
  /// state to host memory, and a background thread writes the file
  /// (Trainer::save_checkpoint_async, Lightning's AsyncCheckpointIO); the
  /// file, its atomicity and the resume are those of a synchronous save, but
  /// it is on disk only once the write completes, at a later batch (see
  /// docs/training.md, When a checkpoint is on disk). The cost is host memory
  /// for one copy of the state, kept from one save to the next.
  bool async_checkpointing = false;
  /// Adds a ProgressBar when none is among `callbacks`.
  bool enable_progress_bar = true;
  /// Adds a ModelSummary when none is among `callbacks`.
  bool enable_model_summary = true;
  /// Sums gradients over N batches before each optimizer step.
  int64_t accumulate_grad_batches = 1;
  /// Clips gradients before each optimizer step (unset: no clipping).
  std::optional<double> gradient_clip_val;
  /// "norm" (the total 2-norm) or "value" (each element).
  std::string gradient_clip_algorithm = "norm";
  /// Makes LibTorch use deterministic algorithms while a loop runs: an
  /// operation that has no deterministic implementation throws. The previous
  /// setting is put back when the loop ends.
  bool deterministic = false;
  /// Runs training steps and their backward under autograd's anomaly
  /// detection: a backward that produces NaN throws, naming the operation.
  bool detect_anomaly = false;
  /// The value of cuDNN's benchmark flag (Accelerator::set_benchmark: CUDA's
  /// cuDNN autotuning; nothing on accelerators without it), set when a loop
  /// starts and left so. Unset: false with `deterministic`, else as it is.
  std::optional<bool> benchmark;
  /// Runs trainer.validate, test and predict under torch::InferenceMode
  /// (false: torch::NoGradGuard); fit's validation always runs under
  /// NoGradGuard, and so does every evaluation under ddp on gloo.
  bool inference_mode = true;
  /// Turns off what costs time per step, to measure the Trainer's own
  /// overhead: checkpointing, loggers and log(), the progress bar, the model
  /// summary and the sanity check; a ConfigError when a loop starts for what
  /// must then be off (fast_dev_run, detect_anomaly, profiler, loggers, a
  /// checkpointing or progress-bar callback).
  bool barebones = false;
  /// Under ddp, fit replaces the module's BatchNorm layers by SyncBatchNorm
  /// (convert_sync_batchnorm), whose batch statistics are those of all ranks'
  /// batches together, and puts them back when the fit ends; a BatchNorm held
  /// by a typed member of a module is a ConfigError (declare it as
  /// fulgor::SyncBatchNorm instead). Without ddp it does nothing.
  bool sync_batchnorm = false;
  /// "" (off) or "simple": Lightning's SimpleProfiler records the time spent
  /// in each hook and loop stage, and its report is printed (or written, see
  /// profiler_filename) when each loop ends; Trainer::profiler() reads it.
  /// Off costs nothing (docs/training.md, Profiler).
  std::string profiler;
  /// Where the profiler's report file goes ("": the Trainer's log_dir).
  std::string profiler_dirpath;
  /// With a name, the report is appended to
  /// `<profiler_dirpath>/<stage>-<name>.txt` instead of printed.
  std::string profiler_filename;
  /// Where logs and checkpoints go by default ("" is the working directory).
  std::string default_root_dir;
  /// Seeds the CPU's generator and those of the accelerator's devices
  /// (fulgor::seed_accelerator) when a loop starts, after the module was
  /// built: the seed decides the loaders' shuffling, dropout and any other
  /// random draw in the loops, not the module's initial weights (call
  /// fulgor::seed_everything before building the module for those). From 0
  /// to 2^32 - 1 (fulgor::kMaxSeed), Lightning's range; others are refused.
  std::optional<uint64_t> seed;
  /// Under strategy "ddp": seconds the rendezvous and each collective may wait
  /// for the other ranks before failing (unset: 30 minutes, Lightning's
  /// default). The first Trainer of a process sets it for the process.
  std::optional<double> ddp_timeout;
  /// Under strategy "ddp", gives each rank its shard of every loader that can
  /// be sharded (fulgor::TensorLoader and fulgor::make_data_loader's, whose
  /// sampler is fulgor's) as each loop starts: training shards are evenly
  /// padded, evaluation and prediction shards count every sample once.
  /// Lightning's use_distributed_sampler; false leaves the loaders as they are
  /// (docs/training.md, Distributed sampling).
  bool use_distributed_sampler = true;
};

/// Converts options to JSON. Callbacks and loggers are left out.
FULGOR_API void to_json(nlohmann::json& json, const TrainerOptions& options);
/// Fills options from a JSON object holding any subset of the option names.
/// Throws ConfigError naming the key for an unknown key (listing the known
/// ones) or an ill-typed value (naming the expected type).
FULGOR_API void from_json(const nlohmann::json& json, TrainerOptions& options);

FULGOR_API void to_json(nlohmann::json& json, const Limit& limit);
FULGOR_API void from_json(const nlohmann::json& json, Limit& limit);
FULGOR_API void to_json(nlohmann::json& json, const Devices& devices);
FULGOR_API void from_json(const nlohmann::json& json, Devices& devices);

/// Sets one option from its textual form as typed on a command line
/// (`max_epochs`, `"3"`). Throws ConfigError naming the key and the expected
/// type when the key is unknown or the text does not parse.
FULGOR_API void set_option(TrainerOptions& options, const std::string& key, const std::string& value);

/// Checks every value as a Trainer does when a loop starts: throws ConfigError
/// naming the first option whose value is not accepted (a count out of its
/// range, a fraction outside [0, 1], NaN or an infinity, an unknown name).
FULGOR_API void check_options(const TrainerOptions& options);

/// The names of all options JSON and the command line accept, in declaration order.
FULGOR_API std::vector<std::string> trainer_option_names();

}  // namespace fulgor
