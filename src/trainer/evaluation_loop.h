#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/detail/step_runner.h"

namespace fulgor::detail {

struct TrainerState;

// Lightning's _EvaluationLoop and _PredictionLoop, as one: a run of
// validation (inside fit, in the sanity check, or on its own), test or
// predict over a loader.
struct EvaluationLoop {
  explicit EvaluationLoop(TrainerState& state) : s(state) {}

  // One run; returns the epoch's values, and predict_step's outputs in
  // `outputs` when given.
  std::map<std::string, double> run(StepRunner& runner, Stage stage, std::optional<int64_t> limit,
                                    std::vector<torch::Tensor>* outputs = nullptr);
  // Lightning's _run_sanity_check.
  void sanity_check(StepRunner& runner, std::optional<int64_t> limit);

  // Batches the running loop runs (Trainer::num_eval_batches).
  std::optional<int64_t> batches;

 private:
  enum Point { kStart, kEpochStart, kEpochEnd, kEnd };
  void hook(Stage stage, Point point);
  void batch_hook(Stage stage, bool start, int64_t i, const torch::Tensor& out);
  void run_batches(StepRunner& runner, Stage stage, std::optional<int64_t> limit,
                   std::vector<torch::Tensor>* outputs);

  TrainerState& s;
};

}  // namespace fulgor::detail
