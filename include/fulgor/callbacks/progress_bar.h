#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Shows progress (Lightning's TQDMProgressBar): on a terminal, one line
/// redrawn in place with the epoch, a bar, batches done of the total, the rate,
/// the time left and the prog_bar metrics; otherwise plain lines every
/// `refresh_lines` percent of an epoch (or every 50 batches when the length is
/// unknown), at least `min_line_seconds` apart, and one per finished epoch and
/// evaluation, each written once.
class FULGOR_API ProgressBar : public Callback {
 public:
  /// `out`: where to write (nullptr: std::cout). `terminal`: whether `out`
  /// shows a line redrawn in place; unset means when `out` is std::cout and
  /// stdout is a terminal. `min_line_seconds` keeps an epoch that lasts a
  /// moment from filling a log file (and a fast loop from formatting lines).
  explicit ProgressBar(std::ostream* out = nullptr, int64_t refresh_lines = 10,
                       std::optional<bool> terminal = std::nullopt, double min_line_seconds = 1.0);

  bool shows_progress() const override { return true; }
  void on_train_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_epoch_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor& loss, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, ModuleBase& module) override;
  void on_validation_start(Trainer& trainer, ModuleBase& module) override;
  void on_validation_batch_end(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_validation_end(Trainer& trainer, ModuleBase& module) override;
  void on_test_start(Trainer& trainer, ModuleBase& module) override;
  void on_test_batch_end(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_test_end(Trainer& trainer, ModuleBase& module) override;
  void on_predict_start(Trainer& trainer, ModuleBase& module) override;
  void on_predict_batch_end(Trainer& trainer, ModuleBase& module, int64_t batch_idx) override;
  void on_predict_end(Trainer& trainer, ModuleBase& module) override;

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream& out() const;
  void begin(const std::string& label);
  void update(Trainer& trainer, int64_t done, std::optional<int64_t> total, bool final);
  std::string metrics_text(const Trainer& trainer) const;

  std::ostream* out_;
  bool terminal_;
  int64_t refresh_lines_;
  std::chrono::duration<double> min_line_interval_;
  std::string label_;
  Clock::time_point start_, last_draw_;  // last_draw_: also the last plain line's time
  int64_t next_line_ = 0;
  // The batches done when the bar began: a resumed epoch's rate counts its own.
  int64_t begun_at_ = 0;
  // The batches done when the current plain line was last written (-1: none).
  int64_t last_line_ = -1;
  // Before this many batches are done, no line or redraw can be due.
  int64_t next_look_ = 0;
  bool in_eval_during_fit_ = false;
};

}  // namespace fulgor
