#pragma once

#include <map>
#include <string>

#include "loops/inference_loop.h"

namespace fulgor::detail {

// Lightning's _EvaluationLoop: a run of validation (inside fit, as its sanity
// check, or on its own) or of test. run() is setup_data, then, when there
// are batches to run, on-run-start (the module's eval hook, the start
// hooks), the batches, and on-run-end (the epoch's values, the end hooks, the
// module's train hook).
class EvaluationLoop : public InferenceLoop {
 public:
  EvaluationLoop(LoopContext& state, Stage stage) : InferenceLoop(state, stage) {}

  // One run; returns the epoch's values.
  std::map<std::string, double> run();
  // Lightning's _run_sanity_check, for fit's validation loop: a short run
  // whose values reach no logger and are forgotten afterwards, leaving the
  // generators as it found it.
  void sanity_check();
  // Whether the loop validates at all: Lightning's enable_validation (a
  // loader, and a limit_val_batches above 0).
  bool enabled() const;

 private:
  std::map<std::string, double> run_limited(std::optional<int64_t> limit);
  void model_mode_hook(bool eval);
};

}  // namespace fulgor::detail
