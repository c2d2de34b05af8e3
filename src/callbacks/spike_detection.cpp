#include "fulgor/callbacks/spike_detection.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include "fulgor/trainer.h"

namespace fulgor {

SpikeDetection::SpikeDetection(SpikeDetectionOptions options) : options_(std::move(options)) {
  if (options_.mode != "min" && options_.mode != "max")
    throw ConfigError(fmt::format("SpikeDetection: mode \"{}\": expected \"min\" or \"max\"", options_.mode));
  if (options_.window < 1)
    throw ConfigError(fmt::format("SpikeDetection: window={}: expected an integer >= 1", options_.window));
}

// torchmetrics' Running(MeanMetric) over no values gives NaN, which no
// tolerance check passes.
double SpikeDetection::running_mean() const {
  if (window_.empty()) return std::numeric_limits<double>::quiet_NaN();
  return std::accumulate(window_.begin(), window_.end(), 0.0) / static_cast<double>(window_.size());
}

bool SpikeDetection::is_spike(double loss) const {
  const double running = running_mean();
  const double diff = loss - last_val_;
  if (options_.finite_only && !std::isfinite(loss)) return true;
  if (options_.mode == "min" ? diff <= 0.0 : diff >= 0.0) return false;
  const bool atol = !options_.atol || std::abs(loss - running) >= std::abs(*options_.atol);
  const bool rtol = !options_.rtol || std::abs(loss - running) >= std::abs(*options_.rtol * running);
  return atol && rtol;
}

void SpikeDetection::on_train_batch_end(Trainer& trainer, ModuleBase&, const torch::Tensor& loss, int64_t batch_idx) {
  if (!loss.defined()) return;  // a skipped batch has no loss to check
  auto& path = options_.exclude_batches_path;
  if (path.empty()) path = trainer.default_root_dir();
  if (std::filesystem::path(path).extension() != ".json")
    path = (std::filesystem::path(path) / "skip_batches.json").string();
  const double value = loss.item<double>();
  const bool spike = batch_idx >= options_.warmup && is_spike(value);
  if (trainer.reduce_boolean_decision(spike, /*all=*/false)) return handle_spike(trainer, batch_idx);
  const bool finite_all = options_.finite_only || trainer.reduce_boolean_decision(std::isfinite(value), /*all=*/true);
  if (!finite_all) return;
  window_.push_back(value);
  if (static_cast<int64_t>(window_.size()) > options_.window) window_.pop_front();
  last_val_ = value;
}

void SpikeDetection::handle_spike(Trainer& trainer, int64_t batch_idx) {
  bad_batches_.push_back(batch_idx - 1);
  bad_batches_.push_back(batch_idx);
  if (trainer.is_global_zero()) {
    const std::filesystem::path path(options_.exclude_batches_path);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
    std::ofstream out(path);
    out << nlohmann::json(bad_batches_).dump(4);
    if (!out) throw Error(fmt::format("SpikeDetection: cannot write '{}'", path.string()));
  }
  throw TrainingSpikeException(batch_idx);
}

nlohmann::json SpikeDetection::state_dict() const {
  return {{"last_val", last_val_},
          {"mode", options_.mode},
          {"warmup", options_.warmup},
          {"atol", options_.atol ? nlohmann::json(*options_.atol) : nlohmann::json(nullptr)},
          {"rtol", options_.rtol ? nlohmann::json(*options_.rtol) : nlohmann::json(nullptr)},
          {"bad_batches", bad_batches_},
          {"bad_batches_path", options_.exclude_batches_path},
          {"running", window_}};
}

// As Lightning's, the saved settings replace the constructor's.
void SpikeDetection::load_state_dict(const nlohmann::json& state) {
  last_val_ = state.at("last_val").get<double>();
  options_.mode = state.at("mode").get<std::string>();
  if (options_.mode != "min" && options_.mode != "max")
    throw ConfigError(fmt::format("SpikeDetection state: mode \"{}\": expected \"min\" or \"max\"", options_.mode));
  options_.warmup = state.at("warmup").get<int64_t>();
  const auto& atol = state.at("atol");
  options_.atol = atol.is_null() ? std::nullopt : std::optional<double>(atol.get<double>());
  const auto& rtol = state.at("rtol");
  options_.rtol = rtol.is_null() ? std::nullopt : std::optional<double>(rtol.get<double>());
  bad_batches_ = state.at("bad_batches").get<std::vector<int64_t>>();
  options_.exclude_batches_path = state.at("bad_batches_path").get<std::string>();
  const auto running = state.at("running").get<std::vector<double>>();
  window_.assign(running.begin(), running.end());
  while (static_cast<int64_t>(window_.size()) > options_.window) window_.pop_front();
}

}  // namespace fulgor
