#include "fulgor/callbacks/timer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <regex>

#include "fulgor/core/error.h"
#include "fulgor/trainer.h"

namespace fulgor {

Timer::Timer(Duration duration, Interval interval) : duration_(duration), interval_(interval) {
  if (!(std::isfinite(duration.count()) && duration.count() >= 0))
    throw ConfigError(fmt::format("Timer: duration must be a finite number of seconds >= 0, got {}", duration.count()));
}

namespace {
Timer::Duration parse_duration(const std::string& text) {
  static const std::regex shape(R"((\d{1,9}):(\d\d):(\d\d):(\d\d))");
  std::smatch m;
  // libstdc++'s regex recurses once per character: a long text is refused before it is matched.
  if (text.size() > 20 || !std::regex_match(text, m, shape))
    throw ConfigError(fmt::format("Timer: duration \"{}\" is not of the form DD:HH:MM:SS", text));
  const double seconds = std::stod(m[1]) * 86400 + std::stod(m[2]) * 3600 + std::stod(m[3]) * 60 + std::stod(m[4]);
  return Timer::Duration(seconds);
}
}  // namespace

Timer::Timer(const std::string& duration, Interval interval) : Timer(parse_duration(duration), interval) {}

nlohmann::json Timer::state_dict() const { return {{"time_elapsed", time_elapsed()}}; }

void Timer::load_state_dict(const nlohmann::json& state) { offset_ = state.at("time_elapsed").get<double>(); }

void Timer::on_train_start(Trainer&, ModuleBase&) {
  start_ = std::chrono::steady_clock::now();
  end_.reset();
}

void Timer::on_train_end(Trainer&, ModuleBase&) { end_ = std::chrono::steady_clock::now(); }

double Timer::time_elapsed() const {
  if (!start_) return offset_;
  auto end = end_ ? *end_ : std::chrono::steady_clock::now();
  return offset_ + std::chrono::duration<double>(end - *start_).count();
}

void Timer::check(Trainer& trainer) {
  if (time_elapsed() >= duration_.count())
    trainer.request_stop(
        fmt::format("Timer: time limit of {:.0f} s reached after {:.1f} s", duration_.count(), time_elapsed()));
}

void Timer::on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor&, int64_t) {
  if (interval_ == Interval::step) check(trainer);
}

void Timer::on_train_epoch_end(Trainer& trainer, ModuleBase&) {
  if (interval_ == Interval::epoch) check(trainer);
}

}  // namespace fulgor
