#pragma once

#include <torch/types.h>

#include <vector>

#include "loops/inference_loop.h"

namespace fulgor::detail {

// Lightning's _PredictionLoop: predict_step over the loader, whose outputs
// run() returns in order. Nothing is logged in it.
class PredictionLoop : public InferenceLoop {
 public:
  explicit PredictionLoop(LoopContext& state) : InferenceLoop(state, Stage::predict) {}

  std::vector<torch::Tensor> run();
};

}  // namespace fulgor::detail
