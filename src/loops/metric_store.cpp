#include "loops/metric_store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

#include "fulgor/core/error.h"
#include "fulgor/distributed/strategy.h"
#include "fulgor/metrics/metric.h"
#include "loops/context.h"
#include "loops/fit_loop.h"

namespace fulgor::detail {

void MetricStore::log(std::string_view name, double value, const LogOptions& o) {
  if (FULGOR_UNLIKELY(barebones())) return;
  record(name, value, o, true);
}

bool MetricStore::barebones() {
  if (!s.options.barebones) return false;
  s.warn_once(
      "You are trying to `self.log()` but `Trainer(barebones=True)` is configured. Logging can impact raw speed so it "
      "is disabled under this setting.");
  return true;
}

// Note [Epoch values over the ranks]
// Lightning 2.6's rule for sync_dist (_ResultMetric.update and compute): a
// value logged on_step is reduced over the ranks as it is logged, since the
// step's value is what is shown; what joins the epoch is the rank's own
// value, accumulated locally (weighted sum and weight for a mean, sum,
// running max or min), and the ranks' accumulators are combined once, when
// the epoch's values are computed: mean = the ranks' weighted sums over their
// weights summed, sum = the sums summed, max and min over the ranks. An epoch
// value is then the value over every sample the ranks saw together, and no
// collective happens per batch for it, which uneven evaluation shards need
// (Note [Distributed sampling] in context.cpp).
// The combination is a collective at every refresh() (the points where the
// ranks compute logged metrics, the same on every rank), in a fixed order:
// one all_reduce checks that every rank logged the same sync_dist names (with
// the same reductions), then one sums the means' and sums' parts and one
// takes the maxima (minima negated). A rank that logged other names fails
// with DistributedError rather than mixing up the ranks' values.
namespace {

using SyncedAccumulators = std::vector<std::pair<std::string, const Accumulator*>>;

// The first collective: every rank logged the same sync_dist names with the
// same reductions, or this rank fails naming its own.
void agree_on_synced_names(const SyncedAccumulators& synced, ProcessGroup& group, int64_t rank) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over "name:reduce;"...
  for (const auto& [name, acc] : synced) {
    const std::string key = fmt::format("{}:{};", name, static_cast<int>(acc->options.reduce));
    for (unsigned char c : key) hash = (hash ^ c) * 1099511628211ull;
  }
  // Two 26-bit halves are exact in a double; max and min (negated max) at once.
  const double count = static_cast<double>(synced.size()), low = static_cast<double>(hash & ((1u << 26) - 1)),
               high = static_cast<double>((hash >> 26) & ((1u << 26) - 1));
  torch::Tensor header = torch::tensor({count, low, high, -count, -low, -high}, torch::kDouble).to(group.device());
  group.all_reduce(header, ReduceOp::max);
  const torch::Tensor agreed = header.cpu();
  const double* h = agreed.data_ptr<double>();
  if (h[0] == -h[3] && h[1] == -h[4] && h[2] == -h[5]) return;
  std::vector<std::string> names;
  for (const auto& entry : synced) names.push_back(entry.first);
  throw DistributedError(fmt::format(
      "rank {} logged the values [{}] with sync_dist this epoch, and another rank other ones (between {} and {} "
      "names): under ddp every rank must log the same names with sync_dist and the same reduce in an epoch, "
      "since their epoch values are reduced together",
      rank, fmt::join(names, ", "), -h[3], h[0]));
}

// `values` reduced over the ranks with `op`; an undefined tensor if none.
torch::Tensor all_reduced_values(const std::vector<double>& values, ProcessGroup& group, ReduceOp op) {
  if (values.empty()) return {};
  torch::Tensor reduced = torch::tensor(values, torch::kDouble).to(group.device());
  group.all_reduce(reduced, op);
  return reduced.cpu();
}

// The other two: the means' and sums' parts summed, the maxima (minima
// negated) taken; each name's epoch value over the ranks.
std::map<std::string, double> combined_epoch_values(const SyncedAccumulators& synced, ProcessGroup& group) {
  std::vector<double> sums, extremes;
  for (const auto& [name, acc] : synced) {
    if (acc->options.reduce == Reduce::mean) sums.insert(sums.end(), {acc->sum, acc->weight});
    if (acc->options.reduce == Reduce::sum) sums.push_back(acc->sum);
    if (acc->options.reduce == Reduce::max) extremes.push_back(acc->extreme);
    if (acc->options.reduce == Reduce::min) extremes.push_back(-acc->extreme);
  }
  const torch::Tensor summed = all_reduced_values(sums, group, ReduceOp::sum);
  const torch::Tensor largest = all_reduced_values(extremes, group, ReduceOp::max);
  auto next = [](const torch::Tensor& t, size_t& at) { return t[static_cast<int64_t>(at++)].item<double>(); };
  size_t next_sum = 0, next_extreme = 0;
  std::map<std::string, double> values;
  for (const auto& [name, acc] : synced) {
    switch (acc->options.reduce) {
      case Reduce::mean: {
        const double sum = next(summed, next_sum), weight = next(summed, next_sum);
        values[name] = weight > 0 ? sum / weight : 0.0;
        break;
      }
      case Reduce::sum:
        values[name] = next(summed, next_sum);
        break;
      case Reduce::max:
        values[name] = next(largest, next_extreme);
        break;
      case Reduce::min:
        values[name] = -next(largest, next_extreme);
        break;
    }
  }
  return values;
}

}  // namespace

std::map<std::string, double> MetricStore::synced_epoch_values(const MetricTable<Accumulator>& accumulators) {
  if (!s.ddp) return {};
  // The names in MetricTable's order (sorted), with their reductions.
  SyncedAccumulators synced;
  for (const auto& [name, acc] : accumulators.map())
    if (acc.any && acc.sync && !acc.metric) synced.emplace_back(name, &acc);
  ProcessGroup& group = s.ddp->group();
  agree_on_synced_names(synced, group, s.ddp->environment().rank);
  if (synced.empty()) return {};
  return combined_epoch_values(synced, group);
}

void MetricStore::record(std::string_view name, double local_value, const LogOptions& o, bool accumulate) {
  // Only a training step logs in a train_step context: the common case
  // needs no string comparison.
  if (context != LogContext::train_step && s.running == RunningStage::predicting) return;
  const bool sync = o.sync_dist && s.ddp;
  if (context == LogContext::none) {
    record_now({{std::string(name), sync ? s.ddp->reduce(local_value, o.reduce) : local_value}}, o.prog_bar, o.logger);
    return;
  }
  const bool training = context == LogContext::train_step || context == LogContext::train_epoch;
  const bool step_default = context == LogContext::train_step;
  const bool on_step = o.on_step.value_or(step_default), on_epoch = o.on_epoch.value_or(!step_default);
  // Note [Epoch values over the ranks]: the step's value is reduced now, the
  // epoch accumulates the rank's own.
  const double value = local_value;
  if (on_step) {
    const double step_value = sync ? s.ddp->reduce(local_value, o.reduce) : local_value;
    // name_step beside an epoch value; else the name itself, not a copy.
    const std::string suffixed = on_epoch ? std::string(name) + "_step" : std::string();
    const std::string_view step_name = on_epoch ? std::string_view(suffixed) : name;
    // Lightning's callback metrics take an evaluation loop's values only
    // once its epoch ends (_ResultCollection.metrics).
    if (training) {
      callback_metrics[step_name] = step_value;
      if (on_epoch) callback_metrics[name] = step_value;
    }
    if (o.prog_bar) progress_bar_metrics[step_name] = step_value;
    // logged_metrics follows every batch, as Lightning's on_batch_end
    // updates it; the loggers get only the due batches' values.
    if (o.logger) {
      logged_metrics[step_name] = step_value;
      if (step_log_due) pending_step[std::string(step_name)] = step_value;
    }
  }
  if (on_epoch && accumulate) {
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
    acc.sync = sync;
    acc.options = o;
  }
}

void MetricStore::log_on_device(std::string_view name, const torch::Tensor& value, const LogOptions& o) {
  if (FULGOR_UNLIKELY(barebones())) return;
  defer(name, value, o, true);
}

void MetricStore::defer(std::string_view name, const torch::Tensor& value, const LogOptions& o, bool accumulate) {
  if (context != LogContext::train_step && s.running == RunningStage::predicting) return;
  const bool step_default = context == LogContext::train_step;
  // Note [Deferred reads]: these need the number now (a step value with
  // sync_dist is reduced over the ranks as it is logged).
  if (context == LogContext::none || (o.sync_dist && s.ddp && o.on_step.value_or(step_default))) {
    record(name, value.item<double>(), o, accumulate);
    return;
  }
  if (o.logger && step_log_due && o.on_step.value_or(step_default)) deferred_step_logs_ = true;
  deferred_.push_back({std::string(name), value.detach(), o, context, current_batch_size, step_log_due, accumulate});
  // A run whose tables nobody reads for long keeps a bounded backlog.
  constexpr size_t kMaxDeferred = 4096;
  if (deferred_.size() >= kMaxDeferred) read_deferred();
}

void MetricStore::log_metric(std::string_view name, metrics::Metric& metric, const LogOptions& o) {
  if (FULGOR_UNLIKELY(barebones())) return;
  if (context != LogContext::train_step && s.running == RunningStage::predicting) return;
  if (context == LogContext::none) {
    record_now({{std::string(name), metric_value(name, metric)}}, o.prog_bar, o.logger);
    return;
  }
  const bool training = context == LogContext::train_step || context == LogContext::train_epoch;
  const bool step_default = context == LogContext::train_step;
  const bool on_step = o.on_step.value_or(step_default), on_epoch = o.on_epoch.value_or(!step_default);
  auto& acc = (training ? train_accumulators : eval_accumulators)[name];
  acc.metric = &metric;
  acc.options = o;
  acc.any = on_epoch;
  acc.both = on_step && on_epoch;
  if (!on_step) return;
  const torch::Tensor& value = metric.batch_value();
  if (!value.defined())
    throw ConfigError(
        fmt::format("log('{}', metric) on_step needs the batch's value: update the metric with "
                    "forward() (or call it) before logging it, not with update()",
                    name));
  if (value.numel() != 1)
    throw ConfigError(fmt::format("log('{}', metric): the metric's value has shape [{}]; log() takes one value", name,
                                  fmt::join(value.sizes(), ", ")));
  // The batch's own value, as Lightning logs a Metric's forward cache.
  LogOptions step_options = o;
  step_options.sync_dist = false;
  if (value.device().is_cpu())
    record(name, value.item<double>(), step_options, false);
  else
    defer(name, value, step_options, false);
}

double MetricStore::metric_value(std::string_view name, metrics::Metric& metric) {
  const torch::Tensor value = s.ddp ? metric.compute(s.ddp->group()) : metric.compute();
  if (value.numel() != 1)
    throw ConfigError(fmt::format("log('{}', metric): the metric's value has shape [{}]; log() takes one value", name,
                                  fmt::join(value.sizes(), ", ")));
  return value.item<double>();
}

void MetricStore::read_deferred() {
  if (deferred_.empty()) return;
  std::vector<Deferred> entries;
  entries.swap(deferred_);
  deferred_step_logs_ = false;
  // One copy to the host for all the values on the first one's device.
  const torch::Tensor& first = entries.front().value;
  std::vector<torch::Tensor> together;
  together.reserve(entries.size());
  for (const Deferred& d : entries)
    if (d.value.device() == first.device()) together.push_back(d.value.reshape({}).to(first.scalar_type()));
  const torch::Tensor host = torch::stack(together).to(torch::kCPU, torch::kDouble);
  const double* values = host.data_ptr<double>();
  const LogContext saved_context = context;
  const int64_t saved_batch_size = current_batch_size;
  const bool saved_due = step_log_due;
  size_t next = 0;
  for (const Deferred& d : entries) {
    context = d.context;
    current_batch_size = d.batch_size;
    step_log_due = d.step_log_due;
    record(d.name, d.value.device() == first.device() ? values[next++] : d.value.item<double>(), d.options,
           d.accumulate);
  }
  context = saved_context;
  current_batch_size = saved_batch_size;
  step_log_due = saved_due;
}

void MetricStore::flush_step_logs() {
  if (deferred_step_logs_) read_deferred();
  std::optional<int64_t> eval_step;  // Note [Logged steps]
  if (context == LogContext::eval_step && !s.sanity_checking()) eval_step = eval_log_step++;
  if (pending_step.empty()) return;
  send_to_loggers(pending_step, eval_step, !eval_step);
  pending_step.clear();
}

void MetricStore::send_to_loggers(std::map<std::string, double> metrics, std::optional<int64_t> step, bool with_epoch) {
  // The sanity check's values reach no logger, and are forgotten after it.
  if (metrics.empty() || s.sanity_checking()) return;
  for (const auto& [k, v] : metrics) logged_metrics[k] = v;
  if (with_epoch) metrics["epoch"] = static_cast<double>(s.fit().current_epoch());
  for (auto& logger : s.loggers) logger->log_metrics(metrics, step.value_or(log_step));
}

void MetricStore::record_now(const std::map<std::string, double>& metrics, bool prog_bar, bool logger) {
  for (const auto& [k, v] : metrics) {
    callback_metrics[k] = v;
    if (prog_bar) progress_bar_metrics[k] = v;
  }
  if (logger) send_to_loggers(metrics);
}

std::map<std::string, double> MetricStore::refresh(MetricTable<Accumulator>& accumulators,
                                                   std::map<std::string, double>* to_log) {
  read_deferred();
  const std::map<std::string, double> synced = synced_epoch_values(accumulators);
  std::map<std::string, double> result;
  for (const auto& [name, acc] : accumulators.map()) {
    if (!acc.any) continue;
    const auto over_ranks = synced.find(name);
    const double value = over_ranks != synced.end()           ? over_ranks->second
                         : acc.metric                         ? metric_value(name, *acc.metric)
                         : acc.options.reduce == Reduce::mean ? (acc.weight > 0 ? acc.sum / acc.weight : 0.0)
                         : acc.options.reduce == Reduce::sum  ? acc.sum
                                                              : acc.extreme;
    publish(name, value, acc.both, acc.options, result, to_log);
  }
  return result;
}

void MetricStore::publish(const std::string& name, double value, bool both, const LogOptions& options,
                          std::map<std::string, double>& result, std::map<std::string, double>* to_log) {
  const std::string epoch_name = both ? name + "_epoch" : name;
  callback_metrics[epoch_name] = value;
  if (both) callback_metrics[name] = value;
  if (options.prog_bar) progress_bar_metrics[epoch_name] = value;
  if (options.logger) {
    logged_metrics[epoch_name] = value;
    if (to_log) (*to_log)[epoch_name] = value;
  }
  result[epoch_name] = value;
}

std::map<std::string, double> MetricStore::aggregate(MetricTable<Accumulator>& accumulators,
                                                     std::optional<int64_t> step) {
  std::map<std::string, double> to_log;
  auto result = refresh(accumulators, &to_log);
  for (const auto& [name, acc] : accumulators.map())
    if (acc.metric) acc.metric->reset();
  accumulators.clear();
  send_to_loggers(to_log, step);
  return result;
}

void MetricStore::clear() {
  // What waits belongs to the tables being cleared.
  deferred_.clear();
  deferred_step_logs_ = false;
  callback_metrics.clear();
  progress_bar_metrics.clear();
  logged_metrics.clear();
}

}  // namespace fulgor::detail
