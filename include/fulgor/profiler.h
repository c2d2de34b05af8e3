#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "fulgor/core/export.h"

namespace fulgor {

/// PyTorch Lightning's SimpleProfiler (extended): the time spent in each
/// action of the loops (each hook of the module and of each callback, the
/// training step, the data, the optimizer step, logging, saving checkpoints),
/// and a report of it as a table. A Trainer with `profiler = "simple"` makes
/// one when it is constructed, records into it in every loop it runs and
/// writes the report when each loop ends (Trainer::profiler() gives it to
/// read); docs/training.md lists the actions and their names.
///
/// Contract:
///   - an action's duration is wall-clock time (steady_clock) from its start
///     to its end, its callee's nested actions included, also when it threw;
///   - records add up over the Trainer's loops, as Lightning's do: the report
///     after test includes the fit before it;
///   - summary(stage) is Lightning's table: "<STAGE> Profiler Report", then
///     rows Action | Mean duration (s) | Num calls | Total time (s) |
///     Percentage %, a "Total" row first (all calls, the time since the
///     profiler was made, 100 %), the actions by total time, largest first.
class FULGOR_API SimpleProfiler {
 public:
  using Clock = std::chrono::steady_clock;

  struct Action {
    std::string name;
    int64_t calls = 0;
    double total_seconds = 0;
    double mean_seconds() const { return calls == 0 ? 0.0 : total_seconds / static_cast<double>(calls); }
  };

  /// dirpath and filename as Lightning's: with a filename the report goes,
  /// appended, to `<dirpath>/<stage>-<filename>.txt` (dirpath "" is the
  /// Trainer's log_dir); without one it is printed to stdout.
  explicit SimpleProfiler(std::string dirpath = {}, std::string filename = {});

  /// The actions recorded, in the order of their first call.
  const std::deque<Action>& actions() const { return actions_; }
  /// The action named `name`, or nullptr when it was never recorded.
  const Action* find(std::string_view name) const;
  /// Seconds since the profiler was made (the report's Total).
  double elapsed_seconds() const;
  /// Lightning's extended report for `stage` ("fit", "validate", ...).
  std::string summary(const std::string& stage) const;
  const std::string& dirpath() const { return dirpath_; }
  const std::string& filename() const { return filename_; }

  /// The action named `name`, added (with no calls) when new; its address
  /// stays valid for the profiler's life, so a caller may keep it.
  Action& action(std::string_view name);
  /// Writes summary(stage): appended to the file that dirpath and filename
  /// name (dirpath "" is `log_dir`), with "-<rank>" after the filename when
  /// `rank` is given (one file per process of a distributed job); else
  /// printed to stdout when `print` is true.
  void describe(const std::string& stage, const std::string& log_dir, std::optional<int64_t> rank, bool print) const;

 private:
  std::string dirpath_, filename_;
  Clock::time_point start_;
  std::deque<Action> actions_;  // a deque keeps addresses stable as it grows
  std::map<std::string, Action*, std::less<>> by_name_;
};

}  // namespace fulgor
