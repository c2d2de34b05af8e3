#include "fulgor/callbacks/progress_bar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <optional>

#include "fulgor/trainer.h"

namespace fulgor {
namespace {

// The batches to run, at `rate` per second, before `wait` has passed (at least one).
int64_t batches_within(std::chrono::duration<double> wait, double rate) {
  return std::max<int64_t>(1, static_cast<int64_t>(wait.count() * rate));
}

std::string clock_text(double seconds) {
  if (!(seconds >= 0) || seconds > 360000) return "--:--";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{:02}:{:02}", s / 60, s % 60);
}

}  // namespace

ProgressBar::ProgressBar(std::ostream* out, int64_t refresh_lines, std::optional<bool> terminal,
                         double min_line_seconds)
    : out_(out),
      terminal_(terminal ? *terminal : out == nullptr && ::isatty(STDOUT_FILENO) == 1),
      refresh_lines_(refresh_lines),
      min_line_interval_(min_line_seconds) {
  if (!(std::isfinite(min_line_seconds) && min_line_seconds >= 0))
    throw ConfigError(
        fmt::format("ProgressBar: min_line_seconds must be a finite number >= 0, got {}", min_line_seconds));
}

std::ostream& ProgressBar::out() const { return out_ ? *out_ : std::cout; }

std::string ProgressBar::metrics_text(const Trainer& trainer) const {
  std::string text;
  for (const auto& [name, value] : trainer.progress_bar_metrics()) text += fmt::format(" {}={:.4g}", name, value);
  return text;
}

void ProgressBar::begin(const std::string& label) {
  label_ = label;
  start_ = last_draw_ = Clock::now();
  begun_at_ = next_line_ = 0;
  last_line_ = -1;
  next_look_ = 0;
}

void ProgressBar::update(Trainer& trainer, int64_t done, std::optional<int64_t> total, bool final) {
  // Note [Looking at the clock]
  // Plain lines: every refresh_lines percent of a known length, else every
  // 50 batches, and no sooner than min_line_interval_ after the last one;
  // redraws on a terminal: ten a second. Until the batch count at which one
  // can next be due (next_look_, by count or by the rate so far), a batch
  // costs one comparison and no clock read (Note [The per-step path] in
  // src/loops/training_epoch_loop.cpp).
  if (!final && done < next_look_) return;
  const bool known = total && *total > 0;
  if (!terminal_ && !final) {
    constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
    const int64_t due =
        known    ? (refresh_lines_ > 0 ? next_line_ + std::max<int64_t>(1, *total * refresh_lines_ / 100) : kNever)
        : !total ? (done + 49) / 50 * 50
                 : kNever;
    if (done < due) {
      next_look_ = due;
      return;
    }
  }
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done - begun_at_) / elapsed : 0.0;
  const std::chrono::duration<double> interval = terminal_ ? std::chrono::duration<double>(0.1) : min_line_interval_;
  if (!final && now - last_draw_ < interval) {
    next_look_ = done + batches_within(interval - (now - last_draw_), rate);
    return;
  }
  next_look_ = done + 1;
  if (terminal_) {
    last_draw_ = now;
    std::string bar;
    if (known) {
      const int width = 25;
      const auto filled = static_cast<int>(width * std::min<int64_t>(done, *total) / *total);
      bar = fmt::format(" [{}{}] {}/{}", std::string(filled, '='), std::string(width - filled, ' '), done, *total);
    } else {
      bar = fmt::format(" {}", done);
    }
    const std::string eta = total && rate > 0 ? clock_text(static_cast<double>(*total - done) / rate) : "--:--";
    out() << "\r\033[K" << label_ << bar << fmt::format(" {:.1f}it/s ETA {} elapsed {}", rate, eta, clock_text(elapsed))
          << metrics_text(trainer);
    if (final) out() << "\n";
    out() << std::flush;
    return;
  }
  if (!final && known) next_line_ = done;
  // An epoch that stopped right after a line (max_steps, a stop request, a
  // length unknown) would end with the same line again.
  if (final && done == last_line_) return;
  last_line_ = done;
  last_draw_ = now;
  out() << label_ << (total ? fmt::format(" {}/{}", done, *total) : fmt::format(" {}", done))
        << fmt::format(" {:.1f}it/s elapsed {}", rate, clock_text(elapsed))
        << (total && rate > 0 && !final ? " ETA " + clock_text(static_cast<double>(*total - done) / rate) : "")
        << metrics_text(trainer) << "\n"
        << std::flush;
}

// An epoch resumed in its middle has no on_train_epoch_start (as in
// Lightning): its line begins here.
void ProgressBar::on_train_start(Trainer& trainer, ModuleBase& module) {
  if (trainer.batches_in_epoch() > 0) on_train_epoch_start(trainer, module);
}

void ProgressBar::on_train_epoch_start(Trainer& trainer, ModuleBase&) {
  const int64_t max = trainer.max_epochs();
  begin(max > 0 ? fmt::format("Epoch {}/{}", trainer.current_epoch() + 1, max)
                : fmt::format("Epoch {}", trainer.current_epoch() + 1));
  // A resumed epoch starts part-way.
  begun_at_ = next_line_ = trainer.batches_in_epoch();
}

void ProgressBar::on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor&, int64_t batch_idx) {
  const int64_t done = batch_idx + 1;  // the epoch's batches done, resumed ones included
  if (done < next_look_) return;       // Note [Looking at the clock]
  // The epoch's last batch is shown by on_train_epoch_end's line, which
  // follows with the epoch's metrics.
  const auto total = trainer.num_training_batches();
  if (total && done >= *total) return;
  update(trainer, done, total, false);
}

void ProgressBar::on_train_epoch_end(Trainer& trainer, ModuleBase&) {
  update(trainer, trainer.batches_in_epoch(), trainer.num_training_batches(), true);
}

void ProgressBar::on_validation_start(Trainer& trainer, ModuleBase&) {
  in_eval_during_fit_ = trainer.stage() == "fit";
  if (!in_eval_during_fit_) begin("Validation");
}

void ProgressBar::on_validation_batch_end(Trainer& trainer, ModuleBase&, int64_t batch_idx) {
  // Inside fit, validation shows only on a terminal, briefly, over the epoch line.
  if (in_eval_during_fit_ && !terminal_) return;
  if (in_eval_during_fit_) {
    const auto now = Clock::now();
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const auto total = trainer.num_eval_batches();
    out() << "\r\033[K" << label_ << " validating " << (batch_idx + 1)
          << (total ? fmt::format("/{}", *total) : std::string()) << std::flush;
    return;
  }
  update(trainer, batch_idx + 1, trainer.num_eval_batches(), false);
}

void ProgressBar::on_validation_end(Trainer& trainer, ModuleBase&) {
  if (!in_eval_during_fit_) out() << "Validation done" << metrics_text(trainer) << "\n" << std::flush;
  in_eval_during_fit_ = false;
}

void ProgressBar::on_test_start(Trainer&, ModuleBase&) { begin("Testing"); }

void ProgressBar::on_test_batch_end(Trainer& trainer, ModuleBase&, int64_t batch_idx) {
  update(trainer, batch_idx + 1, trainer.num_eval_batches(), false);
}

void ProgressBar::on_test_end(Trainer& trainer, ModuleBase&) {
  out() << (terminal_ ? "\r\033[K" : "") << "Testing done" << metrics_text(trainer) << "\n" << std::flush;
}

void ProgressBar::on_predict_start(Trainer&, ModuleBase&) { begin("Predicting"); }

void ProgressBar::on_predict_batch_end(Trainer& trainer, ModuleBase&, int64_t batch_idx) {
  update(trainer, batch_idx + 1, trainer.num_eval_batches(), false);
}

void ProgressBar::on_predict_end(Trainer&, ModuleBase&) {
  if (terminal_) out() << "\n" << std::flush;
}

}  // namespace fulgor
