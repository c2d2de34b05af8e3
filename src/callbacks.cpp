// The small built-in callbacks (ModelCheckpoint and EarlyStopping are in
// src/callbacks/, the progress bar in progress_bar.cpp).

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>

#include "demangle.h"
#include "fulgor/callbacks/learning_rate_monitor.h"
#include "fulgor/callbacks/model_summary.h"
#include "fulgor/callbacks/timer.h"
#include "fulgor/trainer.h"

namespace fulgor {
using detail::demangle;

std::string Callback::state_key() const { return demangle(typeid(*this).name()); }

// ---- LearningRateMonitor ----------------------------------------------------

void LearningRateMonitor::log(Trainer& trainer, Interval interval) {
  std::map<std::string, double> lrs;
  const auto& optimizers = trainer.optimizers();
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const SchedulerConfig* config = nullptr;
    for (const auto& sc : trainer.lr_schedulers())
      if (&sc.scheduler->optimizer() == optimizers[i].get()) config = &sc;
    const Interval own = config ? config->interval : Interval::epoch;
    if ((logging_interval_ ? *logging_interval_ : own) != interval) continue;
    std::string name = config && !config->name.empty() ? config->name : [&] {
      std::string type = demangle(typeid(*optimizers[i]).name());
      return "lr-" + type.substr(type.rfind(':') == std::string::npos ? 0 : type.rfind(':') + 1);
    }();
    if (optimizers.size() > 1 && !(config && !config->name.empty())) name += "-" + std::to_string(i);
    const auto& groups = optimizers[i]->param_groups();
    for (size_t g = 0; g < groups.size(); ++g)
      lrs[g == 0 ? name : fmt::format("{}/pg{}", name, g + 1)] = groups[g].options().get_lr();
  }
  if (!lrs.empty()) trainer.log_metrics(lrs);
}

void LearningRateMonitor::on_train_epoch_start(Trainer& trainer, ModuleBase&) { log(trainer, Interval::epoch); }

void LearningRateMonitor::on_train_batch_start(Trainer& trainer, ModuleBase&, int64_t) {
  if (trainer.logs_due()) log(trainer, Interval::step);
}

// ---- ModelSummary -----------------------------------------------------------

std::string summarize(const torch::nn::Module& module, int64_t max_depth) {
  struct Row {
    std::string name, type;
    int64_t params;
  };
  std::vector<Row> rows;
  auto count = [](const torch::nn::Module& m) {
    int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.numel();
    return n;
  };
  auto short_type = [](std::string type) {
    if (type.rfind("torch::nn::", 0) == 0) type = type.substr(11);
    if (type.size() > 4 && type.compare(type.size() - 4, 4, "Impl") == 0) type.resize(type.size() - 4);
    return type;
  };
  std::function<void(const torch::nn::Module&, const std::string&, int64_t)> walk =
      [&](const torch::nn::Module& m, const std::string& prefix, int64_t depth) {
        for (const auto& child : m.named_children()) {
          const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
          rows.push_back({name, short_type(child.value()->name()), count(*child.value())});
          if (depth < max_depth) walk(*child.value(), name, depth + 1);
        }
      };
  if (max_depth > 0) walk(module, "", 1);
  int64_t trainable = 0, frozen = 0, bytes = 0;
  for (const auto& p : module.parameters()) {
    (p.requires_grad() ? trainable : frozen) += p.numel();
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  size_t name_width = 4, type_width = 4;
  for (const auto& r : rows)
    name_width = std::max(name_width, r.name.size()), type_width = std::max(type_width, r.type.size());
  std::ostringstream out;
  const std::string header =
      fmt::format("  | {:<{}} | {:<{}} | {:>8}", "Name", name_width, "Type", type_width, "Params");
  out << header << "\n" << std::string(header.size(), '-') << "\n";
  for (size_t i = 0; i < rows.size(); ++i)
    out << fmt::format("{:<2}| {:<{}} | {:<{}} | {:>8}\n", i, rows[i].name, name_width, rows[i].type, type_width,
                       rows[i].params);
  out << std::string(header.size(), '-') << "\n";
  out << fmt::format("{:<10}Trainable params\n", trainable);
  out << fmt::format("{:<10}Non-trainable params\n", frozen);
  out << fmt::format("{:<10}Total params\n", trainable + frozen);
  out << fmt::format("{:<10.3f}Total estimated model params size (MB)\n", static_cast<double>(bytes) / 1e6);
  return out.str();
}

void ModelSummary::on_fit_start(Trainer&, ModuleBase& module) {
  (out_ ? *out_ : std::cout) << summarize(module, max_depth_) << std::flush;
}

// ---- Timer --------------------------------------------------------------------

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
