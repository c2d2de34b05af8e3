#include "loops/prediction_loop.h"

#include <torch/torch.h>

#include "loops/module_access.h"
#include "loops/context.h"

namespace fulgor::detail {

std::vector<torch::Tensor> PredictionLoop::run() {
  std::vector<torch::Tensor> outputs;
  if (!setup_data() || max_batches == 0) return outputs;
  ModuleBase& m = *s.module;
  s.running = RunningStage::predicting;
  {
    NoGradContext no_grad(inference_mode());
    ModuleAccess::record_mode(m);
    s.hooks.module("on_predict_model_eval", [&] { m.on_predict_model_eval(); });
    hook(kStart);
    hook(kEpochStart);
    run_batches(max_batches, &outputs);
    hook(kEpochEnd);
    hook(kEnd);
  }
  // Lightning has no on_predict_model_train: the module's mode is put back.
  m.train(ModuleAccess::mode_before_evaluation(m));
  s.running = RunningStage::none;
  return outputs;
}

}  // namespace fulgor::detail
