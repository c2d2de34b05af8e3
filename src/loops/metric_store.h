#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fulgor/module.h"
#include "loops/metric_table.h"

namespace fulgor::detail {

struct LoopContext;

// Which defaults log() applies, by the hook that calls it: the training
// step and batch hooks, an evaluation step and its batch hooks, or an
// epoch-end hook of training or evaluation (whose values join the epoch's).
enum class LogContext { none, train_step, eval_step, train_epoch, eval_epoch };

// One metric's values over an epoch, reduced as its LogOptions say; or a
// logged metrics::Metric (Note [Logged metric objects]).
struct Accumulator {
  double sum = 0, weight = 0, extreme = 0;
  bool any = false, both = false;
  // Logged with sync_dist under ddp: the epoch value is reduced over the
  // ranks when computed (Note [Epoch values over the ranks]).
  bool sync = false;
  LogOptions options;
  metrics::Metric* metric = nullptr;
};

// Where log() goes while a loop runs, and what the Trainer's metric accessors
// and the loggers are given (Lightning's _LoggerConnector and its
// _ResultCollection): step values as they come, epoch values reduced when the
// epoch ends, each labelled with Lightning's step (Note [Logged steps]).
struct MetricStore final : MetricSink {
  explicit MetricStore(LoopContext& state) : s(state) {}

  void log(std::string_view name, double value, const LogOptions& options) override;
  void log_on_device(std::string_view name, const torch::Tensor& value, const LogOptions& options) override;
  void log_metric(std::string_view name, metrics::Metric& metric, const LogOptions& options) override;
  // Records every value logged on a device since the last read, reading them
  // with one copy to the host. Runs before anything reads the tables.
  void read_deferred();

  // Sends the step values logged in the last batch (only a batch whose step
  // log was due records them).
  void flush_step_logs();
  // Note [Logged steps]: an evaluation batch's values come with their own
  // step and without the epoch; a training epoch's with theirs.
  void send_to_loggers(std::map<std::string, double> metrics, std::optional<int64_t> step = std::nullopt,
                       bool with_epoch = true);
  // Values logged outside any loop hook: straight into the tables.
  void record_now(const std::map<std::string, double>& metrics, bool prog_bar, bool logger);
  // Writes the epoch values so far into the callback, progress bar and logged
  // metrics, as Lightning's callback_metrics shows them to epoch-end hooks;
  // returns them all, and in `to_log` those for the loggers.
  std::map<std::string, double> refresh(MetricTable<Accumulator>& accumulators,
                                        std::map<std::string, double>* to_log = nullptr);
  // The epoch's values, sent to the loggers (at `step`, Note [Logged steps]).
  std::map<std::string, double> aggregate(MetricTable<Accumulator>& accumulators,
                                          std::optional<int64_t> step = std::nullopt);
  // Lightning's reset_metrics: as a loop begins, and after the sanity check.
  void clear();

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

 private:
  // Note [Logged metric objects]
  // A metrics::Metric logged on_epoch is kept in its accumulator's place and
  // computed whenever the epoch's values are refreshed (over all ranks under
  // ddp, so every rank refreshes at the same points, as they do), then reset
  // when the epoch's values are aggregated, as Lightning's _ResultCollection
  // computes and resets a torchmetrics Metric. Its step value is the last
  // forward()'s, recorded as a logged tensor's but without joining the epoch
  // (`accumulate` false below). One logged only on_step is kept too, to be
  // reset with the epoch.
  void record(std::string_view name, double value, const LogOptions& options, bool accumulate);
  // Under barebones log() keeps nothing and says so once, as Lightning's.
  bool barebones();
  void defer(std::string_view name, const torch::Tensor& value, const LogOptions& options, bool accumulate);
  // A logged metric's value now, over all ranks under ddp.
  double metric_value(std::string_view name, metrics::Metric& metric);
  // The epoch values of the accumulators logged with sync_dist, reduced over
  // the ranks (Note [Epoch values over the ranks]); empty outside ddp.
  std::map<std::string, double> synced_epoch_values(const MetricTable<Accumulator>& accumulators);
  // Writes one epoch value into the tables refresh() fills.
  void publish(const std::string& name, double value, bool both, const LogOptions& options,
               std::map<std::string, double>& result, std::map<std::string, double>* to_log);

  // Note [Deferred reads]
  // Reading a device tensor on the host (item()) waits for the device to
  // finish the step, which stalls the queue of work a training loop keeps
  // ahead of it. So a value logged on a device is kept as it was logged, with
  // the context it was logged in, and replayed into the tables as log() of
  // its number when something needs the tables: the loggers on a due step,
  // the end of an epoch, a callback asking for the metrics, a scheduler's
  // monitor. All values waiting then are read with one copy to the host, so
  // a run that reads nothing between due steps waits for the device once per
  // due step, as Lightning's does. Step values logged with sync_dist under
  // ddp (reduced over the ranks as they are logged), and values logged
  // outside any loop hook, are read at once.
  struct Deferred {
    std::string name;
    torch::Tensor value;
    LogOptions options;
    LogContext context;
    int64_t batch_size;
    bool step_log_due;
    bool accumulate;
  };
  std::vector<Deferred> deferred_;
  // Whether a deferred value is a step value for the loggers, which
  // flush_step_logs then sends.
  bool deferred_step_logs_ = false;

  LoopContext& s;
};

}  // namespace fulgor::detail
