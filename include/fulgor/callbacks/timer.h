#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"
#include "fulgor/optim/scheduler.h"

namespace fulgor {

/// Stops fitting cleanly once a time budget is spent (Lightning's Timer).
///
/// Contract: checks after every training batch (Interval::step) or epoch
/// (Interval::epoch) and asks the Trainer to stop, naming the budget. The time
/// already spent is saved in checkpoints and counts after a resume.
class FULGOR_API Timer : public Callback {
 public:
  using Duration = std::chrono::duration<double>;
  explicit Timer(Duration duration, Interval interval = Interval::step);
  /// `duration` as "DD:HH:MM:SS"; throws ConfigError for another shape.
  explicit Timer(const std::string& duration, Interval interval = Interval::step);

  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  void on_train_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_end(Trainer& trainer, ModuleBase& module) override;
  void on_train_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor& loss, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, ModuleBase& module) override;

  /// Seconds spent training, this run and the runs it resumed.
  double time_elapsed() const;
  double time_remaining() const { return duration_.count() - time_elapsed(); }

 private:
  void check(Trainer& trainer);
  Duration duration_;
  Interval interval_;
  double offset_ = 0;  // seconds from resumed runs
  std::optional<std::chrono::steady_clock::time_point> start_;
  std::optional<std::chrono::steady_clock::time_point> end_;
};

}  // namespace fulgor
