// The built-in callbacks other than the progress bar.

#include <cxxabi.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <regex>
#include <sstream>

#include "fulgor/callbacks/early_stopping.h"
#include "fulgor/callbacks/learning_rate_monitor.h"
#include "fulgor/callbacks/model_checkpoint.h"
#include "fulgor/callbacks/model_summary.h"
#include "fulgor/callbacks/timer.h"
#include "fulgor/trainer.h"

namespace fulgor {
namespace {

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? out.get() : name;
}

std::string metric_names(const std::map<std::string, double>& metrics) {
  std::vector<std::string> names;
  for (const auto& [k, v] : metrics) names.push_back(k);
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

void check_mode(const std::string& mode, const char* who) {
  if (mode != "min" && mode != "max")
    throw ConfigError(fmt::format("{}: mode must be \"min\" or \"max\", got \"{}\"", who, mode));
}

// JSON has no infinity; the "nothing yet" scores are stored as null.
nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

std::string Callback::state_key() const { return demangle(typeid(*this).name()); }

// ---- ModelCheckpoint --------------------------------------------------------

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  check_mode(options_.mode, "ModelCheckpoint");
  if (options_.save_top_k < -1)
    throw ConfigError(fmt::format("ModelCheckpoint: save_top_k must be >= -1, got {}", options_.save_top_k));
  if (options_.monitor.empty() && options_.save_top_k > 1)
    throw ConfigError(fmt::format(
        "ModelCheckpoint: save_top_k={} ranks checkpoints, which needs a monitor; without one use -1, 0 or 1",
        options_.save_top_k));
  if (options_.filename.empty()) options_.filename = "{epoch}-{step}";
  if (!options_.every_n_epochs && !options_.every_n_train_steps) options_.every_n_epochs = 1;
  dirpath_ = options_.dirpath;
}

std::string ModelCheckpoint::state_key() const {
  return fmt::format("ModelCheckpoint{{monitor={},mode={},every_n_train_steps={},every_n_epochs={}}}", options_.monitor,
                     options_.mode, options_.every_n_train_steps.value_or(0), options_.every_n_epochs.value_or(0));
}

nlohmann::json ModelCheckpoint::state_dict() const {
  nlohmann::json best_k = nlohmann::json::object();
  for (const auto& [path, score] : best_k_models_) best_k[path] = score;
  return {{"dirpath", dirpath_},
          {"best_model_path", best_model_path_},
          {"last_model_path", last_model_path_},
          {"best_k_models", best_k}};
}

void ModelCheckpoint::load_state_dict(const nlohmann::json& state) {
  // Files ranked in another folder are not this run's to keep or delete.
  if (state.value("dirpath", "") != dirpath_) return;
  best_model_path_ = state.value("best_model_path", "");
  last_model_path_ = state.value("last_model_path", "");
  best_k_models_.clear();
  for (const auto& item : state.at("best_k_models").items()) best_k_models_[item.key()] = item.value().get<double>();
}

void ModelCheckpoint::setup(Trainer& trainer, ModuleBase&, const std::string&) {
  if (dirpath_.empty()) dirpath_ = (std::filesystem::path(trainer.default_root_dir()) / "checkpoints").string();
}

std::optional<double> ModelCheckpoint::best_model_score() const {
  auto it = best_k_models_.find(best_model_path_);
  if (it == best_k_models_.end()) return std::nullopt;
  return it->second;
}

std::string ModelCheckpoint::format_checkpoint_name(const std::map<std::string, double>& metrics) const {
  static const std::regex group(R"(\{([^}:]+)(?::([^}]*))?\})");
  std::string out;
  auto begin = std::sregex_iterator(options_.filename.begin(), options_.filename.end(), group);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    out += options_.filename.substr(last, static_cast<size_t>(m.position()) - last);
    last = static_cast<size_t>(m.position() + m.length());
    const std::string name = m[1].str(), spec = m[2].str();
    auto value = metrics.find(name);
    std::string text;
    if (value == metrics.end()) {
      text = "nan";
    } else if (name == "epoch" || name == "step") {
      text = std::to_string(static_cast<int64_t>(value->second));
    } else {
      text =
          spec.empty() ? fmt::format("{}", value->second) : fmt::format(fmt::runtime("{:" + spec + "}"), value->second);
    }
    out += options_.auto_insert_metric_name ? name + "=" + text : text;
  }
  out += options_.filename.substr(last);
  return out;
}

bool ModelCheckpoint::better(double a, double b) const { return options_.mode == "min" ? a < b : a > b; }

void ModelCheckpoint::save(Trainer& trainer) {
  if (trainer.sanity_checking() || trainer.global_step() == last_saved_step_) return;
  namespace fs = std::filesystem;
  std::map<std::string, double> metrics = trainer.callback_metrics();
  metrics["epoch"] = static_cast<double>(trainer.current_epoch());
  metrics["step"] = static_cast<double>(trainer.global_step());
  std::optional<double> score;
  if (!options_.monitor.empty()) {
    auto it = metrics.find(options_.monitor);
    if (it == metrics.end())
      throw ConfigError(
          fmt::format("ModelCheckpoint(monitor=\"{}\") could not find the monitored metric; logged "
                      "metrics: {}. Did you call log(\"{}\", value)?",
                      options_.monitor, metric_names(trainer.callback_metrics()), options_.monitor));
    score = it->second;
  }
  last_saved_step_ = trainer.global_step();
  const std::string path = (fs::path(dirpath_) / (format_checkpoint_name(metrics) + ".ckpt")).string();
  if (options_.save_top_k != 0) {
    bool keep = true;
    if (score && options_.save_top_k > 0 && static_cast<int64_t>(best_k_models_.size()) >= options_.save_top_k &&
        !best_k_models_.count(path)) {
      auto worst = best_k_models_.begin();
      for (auto it = best_k_models_.begin(); it != best_k_models_.end(); ++it)
        if (better(worst->second, it->second)) worst = it;
      keep = std::isfinite(*score) && better(*score, worst->second);
    }
    // Saving is a collective under ddp: save only where every rank would
    // (ranks that log the metric without sync_dist may disagree).
    keep = trainer.reduce_boolean_decision(keep);
    if (keep) {
      trainer.save_checkpoint(path);
      best_k_models_[path] = score.value_or(0.0);
      // Without a monitor the latest is the best; with one, drop the worst past k.
      std::vector<std::string> drop;
      if (!score && options_.save_top_k > 0) {
        for (const auto& [p, s] : best_k_models_)
          if (p != path) drop.push_back(p);
      } else if (options_.save_top_k > 0) {
        while (static_cast<int64_t>(best_k_models_.size() - drop.size()) > options_.save_top_k) {
          std::optional<std::map<std::string, double>::iterator> worst;
          for (auto it = best_k_models_.begin(); it != best_k_models_.end(); ++it) {
            if (std::find(drop.begin(), drop.end(), it->first) != drop.end()) continue;
            if (!worst || better((*worst)->second, it->second)) worst = it;
          }
          drop.push_back((*worst)->first);
        }
      }
      for (const auto& p : drop) {
        best_k_models_.erase(p);
        // Rank 0 wrote the files; another rank's paths may name files it keeps.
        if (p != last_model_path_ && trainer.is_global_zero()) {
          std::error_code ec;
          fs::remove(p, ec);
        }
      }
      best_model_path_ = path;
      if (score)
        for (const auto& [p, s] : best_k_models_)
          if (better(s, best_k_models_[best_model_path_])) best_model_path_ = p;
    }
  }
  if (options_.save_last) {
    last_model_path_ = (fs::path(dirpath_) / "last.ckpt").string();
    trainer.save_checkpoint(last_model_path_);
  }
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor&, int64_t) {
  if (options_.every_n_train_steps && *options_.every_n_train_steps > 0 &&
      trainer.global_step() % *options_.every_n_train_steps == 0)
    save(trainer);
}

void ModelCheckpoint::on_train_epoch_end(Trainer& trainer, ModuleBase&) {
  if (options_.every_n_epochs && *options_.every_n_epochs > 0 &&
      (trainer.current_epoch() + 1) % *options_.every_n_epochs == 0)
    save(trainer);
}

// ---- EarlyStopping ----------------------------------------------------------

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  check_mode(options_.mode, "EarlyStopping");
  if (options_.monitor.empty()) throw ConfigError("EarlyStopping needs a metric to monitor");
  // A positive min_delta must be beaten in the mode's direction.
  options_.min_delta = std::abs(options_.min_delta) * (options_.mode == "min" ? -1.0 : 1.0);
  best_ = options_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

std::string EarlyStopping::state_key() const {
  return fmt::format("EarlyStopping{{monitor={},mode={}}}", options_.monitor, options_.mode);
}

nlohmann::json EarlyStopping::state_dict() const {
  return {{"wait_count", wait_},
          {"stopped_epoch", stopped_epoch_},
          {"best_score", finite_or_null(best_)},
          {"patience", options_.patience}};
}

void EarlyStopping::load_state_dict(const nlohmann::json& state) {
  wait_ = state.at("wait_count").get<int64_t>();
  stopped_epoch_ = state.at("stopped_epoch").get<int64_t>();
  if (!state.at("best_score").is_null()) best_ = state.at("best_score").get<double>();
}

void EarlyStopping::setup(Trainer& trainer, ModuleBase&, const std::string&) {
  // Lightning checks after validation when fit validates, else at epoch end.
  (void)trainer;
  on_validation_ = false;
}

void EarlyStopping::on_validation_end(Trainer& trainer, ModuleBase&) {
  if (trainer.stage() != "fit" || trainer.sanity_checking()) return;
  on_validation_ = true;
  check(trainer);
}

void EarlyStopping::on_train_epoch_end(Trainer& trainer, ModuleBase&) {
  if (!on_validation_) check(trainer);
}

void EarlyStopping::check(Trainer& trainer) {
  const auto& metrics = trainer.callback_metrics();
  auto it = metrics.find(options_.monitor);
  if (it == metrics.end()) {
    if (!options_.strict) return;
    throw ConfigError(fmt::format("EarlyStopping could not find the monitored metric '{}'; logged metrics: {}",
                                  options_.monitor, metric_names(metrics)));
  }
  const double current = it->second;
  const bool min_mode = options_.mode == "min";
  auto improves = [&](double a, double b) { return min_mode ? a < b : a > b; };
  std::string reason;
  if (options_.check_finite && !std::isfinite(current)) {
    reason = fmt::format("Monitored metric {} = {} is not finite. Previous best value was {:.3f}.", options_.monitor,
                         current, best_);
  } else if (options_.stopping_threshold && improves(current, *options_.stopping_threshold)) {
    reason = fmt::format("Stopping threshold reached: {} = {} {} {}.", options_.monitor, current, min_mode ? "<" : ">",
                         *options_.stopping_threshold);
  } else if (options_.divergence_threshold && improves(*options_.divergence_threshold, current)) {
    reason = fmt::format("Divergence threshold reached: {} = {} {} {}.", options_.monitor, current,
                         min_mode ? ">" : "<", *options_.divergence_threshold);
  } else if (improves(current - options_.min_delta, best_)) {
    best_ = current;
    wait_ = 0;
  } else if (++wait_ >= options_.patience) {
    reason = fmt::format("Monitored metric {} did not improve in the last {} records. Best score: {:.3f}.",
                         options_.monitor, wait_, best_);
  }
  if (reason.empty()) return;
  reason_ = "EarlyStopping: " + reason;
  stopped_epoch_ = trainer.current_epoch();
  if (options_.verbose) std::cout << reason_ << " Signaling Trainer to stop." << std::endl;
  trainer.request_stop(reason_);
}

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
  if (duration.count() < 0) throw ConfigError(fmt::format("Timer: duration must be >= 0, got {} s", duration.count()));
}

namespace {
Timer::Duration parse_duration(const std::string& text) {
  static const std::regex shape(R"((\d+):(\d\d):(\d\d):(\d\d))");
  std::smatch m;
  if (!std::regex_match(text, m, shape))
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
