#include "fulgor/callbacks/lambda_callback.h"

namespace fulgor {

namespace {
template <typename F, typename... Args>
void call_if_set(const F& f, Args&&... args) {
  if (f) f(std::forward<Args>(args)...);
}
}  // namespace

void LambdaCallback::setup(Trainer& trainer, ModuleBase& module, const std::string& stage) {
  call_if_set(hooks_.setup, trainer, module, stage);
}
void LambdaCallback::teardown(Trainer& trainer, ModuleBase& module, const std::string& stage) {
  call_if_set(hooks_.teardown, trainer, module, stage);
}
void LambdaCallback::on_fit_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_fit_start, trainer, module);
}
void LambdaCallback::on_fit_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_fit_end, trainer, module);
}
void LambdaCallback::on_sanity_check_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_sanity_check_start, trainer, module);
}
void LambdaCallback::on_sanity_check_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_sanity_check_end, trainer, module);
}
void LambdaCallback::on_train_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_train_start, trainer, module);
}
void LambdaCallback::on_train_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_train_end, trainer, module);
}
void LambdaCallback::on_train_epoch_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_train_epoch_start, trainer, module);
}
void LambdaCallback::on_train_epoch_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_train_epoch_end, trainer, module);
}
void LambdaCallback::on_train_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) {
  call_if_set(hooks_.on_train_batch_start, trainer, module, batch_idx);
}
void LambdaCallback::on_train_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) {
  call_if_set(hooks_.on_train_batch_end, trainer, module, end);
}
void LambdaCallback::on_before_zero_grad(Trainer& trainer, ModuleBase& module, torch::optim::Optimizer& optimizer) {
  call_if_set(hooks_.on_before_zero_grad, trainer, module, optimizer);
}
void LambdaCallback::on_before_backward(Trainer& trainer, ModuleBase& module, const torch::Tensor& loss) {
  call_if_set(hooks_.on_before_backward, trainer, module, loss);
}
void LambdaCallback::on_after_backward(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_after_backward, trainer, module);
}
void LambdaCallback::on_before_optimizer_step(Trainer& trainer, ModuleBase& module,
                                              torch::optim::Optimizer& optimizer) {
  call_if_set(hooks_.on_before_optimizer_step, trainer, module, optimizer);
}
void LambdaCallback::on_validation_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_validation_start, trainer, module);
}
void LambdaCallback::on_validation_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_validation_end, trainer, module);
}
void LambdaCallback::on_validation_epoch_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_validation_epoch_start, trainer, module);
}
void LambdaCallback::on_validation_epoch_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_validation_epoch_end, trainer, module);
}
void LambdaCallback::on_validation_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) {
  call_if_set(hooks_.on_validation_batch_start, trainer, module, batch_idx);
}
void LambdaCallback::on_validation_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) {
  call_if_set(hooks_.on_validation_batch_end, trainer, module, end);
}
void LambdaCallback::on_test_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_test_start, trainer, module);
}
void LambdaCallback::on_test_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_test_end, trainer, module);
}
void LambdaCallback::on_test_epoch_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_test_epoch_start, trainer, module);
}
void LambdaCallback::on_test_epoch_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_test_epoch_end, trainer, module);
}
void LambdaCallback::on_test_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) {
  call_if_set(hooks_.on_test_batch_start, trainer, module, batch_idx);
}
void LambdaCallback::on_test_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) {
  call_if_set(hooks_.on_test_batch_end, trainer, module, end);
}
void LambdaCallback::on_predict_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_predict_start, trainer, module);
}
void LambdaCallback::on_predict_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_predict_end, trainer, module);
}
void LambdaCallback::on_predict_epoch_start(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_predict_epoch_start, trainer, module);
}
void LambdaCallback::on_predict_epoch_end(Trainer& trainer, ModuleBase& module) {
  call_if_set(hooks_.on_predict_epoch_end, trainer, module);
}
void LambdaCallback::on_predict_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) {
  call_if_set(hooks_.on_predict_batch_start, trainer, module, batch_idx);
}
void LambdaCallback::on_predict_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) {
  call_if_set(hooks_.on_predict_batch_end, trainer, module, end);
}
void LambdaCallback::on_save_checkpoint(Trainer& trainer, ModuleBase& module, nlohmann::json& checkpoint) {
  call_if_set(hooks_.on_save_checkpoint, trainer, module, checkpoint);
}
void LambdaCallback::on_load_checkpoint(Trainer& trainer, ModuleBase& module, const nlohmann::json& checkpoint) {
  call_if_set(hooks_.on_load_checkpoint, trainer, module, checkpoint);
}
void LambdaCallback::on_exception(Trainer& trainer, ModuleBase& module, const std::exception& exception) {
  call_if_set(hooks_.on_exception, trainer, module, exception);
}

}  // namespace fulgor
