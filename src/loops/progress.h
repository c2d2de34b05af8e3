#pragma once

// Lightning's loop progress (loops/progress.py): how far a loop has gone, in
// counters that are the loop's whole state. A loop's position for a resume,
// Trainer::current_epoch() and the like are read from them, never kept in
// flags of their own.

#include <cstdint>

namespace fulgor::detail {

// A unit of a loop (an epoch, a batch) is ready once it is fetched or
// begun, started once its start hooks have run, processed once its work is
// done and completed once its end hooks have run. Between units all four are
// equal; while one runs each is at most one ahead of the next.
struct ProgressCounts {
  int64_t ready = 0, started = 0, processed = 0, completed = 0;
};

// Counts over every run of the loop (`total`) and over its current run
// (`current`, reset when a run begins), as Lightning's _Progress.
struct Progress {
  ProgressCounts total, current;

  void increment_ready() { ++total.ready, ++current.ready; }
  void increment_started() { ++total.started, ++current.started; }
  void increment_processed() { ++total.processed, ++current.processed; }
  void increment_completed() { ++total.completed, ++current.completed; }
  void reset() { total = current = {}; }
  void reset_on_run() { current = {}; }
  // Whether a unit has begun and not been processed: a loop that stops (or
  // a checkpoint saved) in the middle of one.
  bool unit_unfinished() const { return current.started > current.processed; }
  // Whether the unit being run is processed and its end hooks are running
  // (or were running when a checkpoint was saved).
  bool unit_ending() const { return current.processed > current.completed; }
};

// Lightning's _BatchProgress: a Progress over batches that also knows
// whether the loader has run out.
struct BatchProgress : Progress {
  bool is_last_batch = false;
  void reset_on_run() {
    Progress::reset_on_run();
    is_last_batch = false;
  }
};

}  // namespace fulgor::detail
