#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// A batch-end function of LambdaHooks. It takes either form of the hook
/// (Callback's): `(Trainer&, ModuleBase&, const BatchEnd&)`, with the batch
/// and the step's outputs, or the shorter `Short` one; a function callable
/// as both is given the BatchEnd.
template <typename Short>
class BatchEndFunction {
  using Full = void(Trainer&, ModuleBase&, const BatchEnd&);

 public:
  BatchEndFunction() = default;
  template <typename F, typename = std::enable_if_t<!std::is_same_v<F, BatchEndFunction> &&
                                                    (std::is_invocable_v<F&, Trainer&, ModuleBase&, const BatchEnd&> ||
                                                     std::is_constructible_v<std::function<Short>, F>)>>
  BatchEndFunction(F f) {  // NOLINT(google-explicit-constructor): assigned like a std::function
    if constexpr (std::is_invocable_v<F&, Trainer&, ModuleBase&, const BatchEnd&>) {
      f_ = std::move(f);
    } else {
      f_ = [g = std::function<Short>(std::move(f))](Trainer& t, ModuleBase& m, const BatchEnd& end) {
        if constexpr (std::is_invocable_v<std::function<Short>&, Trainer&, ModuleBase&, int64_t>)
          g(t, m, end.batch_idx);
        else
          g(t, m, end.outputs, end.batch_idx);
      };
    }
  }
  explicit operator bool() const { return static_cast<bool>(f_); }
  void operator()(Trainer& trainer, ModuleBase& module, const BatchEnd& end) const { f_(trainer, module, end); }

 private:
  std::function<Full> f_;
};

/// The functions a LambdaCallback calls: one per Callback hook, with the
/// hook's arguments. Those left empty do nothing.
struct FULGOR_API LambdaHooks {
  std::function<void(Trainer&, ModuleBase&, const std::string&)> setup;
  std::function<void(Trainer&, ModuleBase&, const std::string&)> teardown;
  std::function<void(Trainer&, ModuleBase&)> on_fit_start;
  std::function<void(Trainer&, ModuleBase&)> on_fit_end;
  std::function<void(Trainer&, ModuleBase&)> on_sanity_check_start;
  std::function<void(Trainer&, ModuleBase&)> on_sanity_check_end;
  std::function<void(Trainer&, ModuleBase&)> on_train_start;
  std::function<void(Trainer&, ModuleBase&)> on_train_end;
  std::function<void(Trainer&, ModuleBase&)> on_train_epoch_start;
  std::function<void(Trainer&, ModuleBase&)> on_train_epoch_end;
  std::function<void(Trainer&, ModuleBase&, int64_t)> on_train_batch_start;
  BatchEndFunction<void(Trainer&, ModuleBase&, const torch::Tensor&, int64_t)> on_train_batch_end;
  std::function<void(Trainer&, ModuleBase&, torch::optim::Optimizer&)> on_before_zero_grad;
  std::function<void(Trainer&, ModuleBase&, const torch::Tensor&)> on_before_backward;
  std::function<void(Trainer&, ModuleBase&)> on_after_backward;
  std::function<void(Trainer&, ModuleBase&, torch::optim::Optimizer&)> on_before_optimizer_step;
  std::function<void(Trainer&, ModuleBase&)> on_validation_start;
  std::function<void(Trainer&, ModuleBase&)> on_validation_end;
  std::function<void(Trainer&, ModuleBase&)> on_validation_epoch_start;
  std::function<void(Trainer&, ModuleBase&)> on_validation_epoch_end;
  std::function<void(Trainer&, ModuleBase&, int64_t)> on_validation_batch_start;
  BatchEndFunction<void(Trainer&, ModuleBase&, int64_t)> on_validation_batch_end;
  std::function<void(Trainer&, ModuleBase&)> on_test_start;
  std::function<void(Trainer&, ModuleBase&)> on_test_end;
  std::function<void(Trainer&, ModuleBase&)> on_test_epoch_start;
  std::function<void(Trainer&, ModuleBase&)> on_test_epoch_end;
  std::function<void(Trainer&, ModuleBase&, int64_t)> on_test_batch_start;
  BatchEndFunction<void(Trainer&, ModuleBase&, int64_t)> on_test_batch_end;
  std::function<void(Trainer&, ModuleBase&)> on_predict_start;
  std::function<void(Trainer&, ModuleBase&)> on_predict_end;
  std::function<void(Trainer&, ModuleBase&)> on_predict_epoch_start;
  std::function<void(Trainer&, ModuleBase&)> on_predict_epoch_end;
  std::function<void(Trainer&, ModuleBase&, int64_t)> on_predict_batch_start;
  BatchEndFunction<void(Trainer&, ModuleBase&, int64_t)> on_predict_batch_end;
  std::function<void(Trainer&, ModuleBase&, nlohmann::json&)> on_save_checkpoint;
  std::function<void(Trainer&, ModuleBase&, const nlohmann::json&)> on_load_checkpoint;
  std::function<void(Trainer&, ModuleBase&, const std::exception&)> on_exception;
};

/// A callback made of functions (Lightning's LambdaCallback): any hook as a
/// lambda, for a quick print or check without a class.
///
/// Contract: each hook calls its function in LambdaHooks when one is set, at
/// the hook's place in the Trainer's order, and does nothing otherwise. It
/// keeps no state. In C++20: `LambdaCallback({.on_train_epoch_end = ...})`.
class FULGOR_API LambdaCallback : public Callback {
 public:
  explicit LambdaCallback(LambdaHooks hooks) : hooks_(std::move(hooks)) {}

  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void teardown(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_fit_start(Trainer& trainer, ModuleBase& module) override;
  void on_fit_end(Trainer& trainer, ModuleBase& module) override;
  void on_sanity_check_start(Trainer& trainer, ModuleBase& module) override;
  void on_sanity_check_end(Trainer& trainer, ModuleBase& module) override;
  void on_train_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_end(Trainer& trainer, ModuleBase& module) override;
  void on_train_epoch_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_epoch_end(Trainer& trainer, ModuleBase& module) override;
  void on_train_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_train_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;
  void on_before_zero_grad(Trainer& trainer, ModuleBase& module, torch::optim::Optimizer& optimizer) override;
  void on_before_backward(Trainer& trainer, ModuleBase& module, const torch::Tensor& loss) override;
  void on_after_backward(Trainer& trainer, ModuleBase& module) override;
  void on_before_optimizer_step(Trainer& trainer, ModuleBase& module, torch::optim::Optimizer& optimizer) override;
  void on_validation_start(Trainer& trainer, ModuleBase& module) override;
  void on_validation_end(Trainer& trainer, ModuleBase& module) override;
  void on_validation_epoch_start(Trainer& trainer, ModuleBase& module) override;
  void on_validation_epoch_end(Trainer& trainer, ModuleBase& module) override;
  void on_validation_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_validation_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;
  void on_test_start(Trainer& trainer, ModuleBase& module) override;
  void on_test_end(Trainer& trainer, ModuleBase& module) override;
  void on_test_epoch_start(Trainer& trainer, ModuleBase& module) override;
  void on_test_epoch_end(Trainer& trainer, ModuleBase& module) override;
  void on_test_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_test_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;
  void on_predict_start(Trainer& trainer, ModuleBase& module) override;
  void on_predict_end(Trainer& trainer, ModuleBase& module) override;
  void on_predict_epoch_start(Trainer& trainer, ModuleBase& module) override;
  void on_predict_epoch_end(Trainer& trainer, ModuleBase& module) override;
  void on_predict_batch_start(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_predict_batch_end(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;
  void on_save_checkpoint(Trainer& trainer, ModuleBase& module, nlohmann::json& checkpoint) override;
  void on_load_checkpoint(Trainer& trainer, ModuleBase& module, const nlohmann::json& checkpoint) override;
  void on_exception(Trainer& trainer, ModuleBase& module, const std::exception& exception) override;

 private:
  LambdaHooks hooks_;
};

}  // namespace fulgor
