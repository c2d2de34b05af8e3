#include "precision/precision_plugin.h"

#include <fmt/format.h>

#include "fulgor/core/error.h"

namespace fulgor::detail {

void PrecisionPlugin::setup(const std::string& value, const Accelerator& accelerator) {
  Precision parsed = Precision::parse(value, accelerator);
  if (parsed.name != precision_.name || !parsed.needs_grad_scaler()) scaler_.reset();
  precision_ = std::move(parsed);
  if (precision_.needs_grad_scaler() && !scaler_) scaler_.emplace();
}

void PrecisionPlugin::save(torch::serialize::OutputArchive& archive) const {
  if (!scaler_) return;
  torch::serialize::OutputArchive scaler_archive;
  scaler_->save(scaler_archive);
  archive.write("grad_scaler", scaler_archive);
}

void PrecisionPlugin::load(torch::serialize::InputArchive& archive, const std::string& path) {
  if (!scaler_) return;
  torch::serialize::InputArchive scaler_archive;
  if (!archive.try_read("grad_scaler", scaler_archive)) return;
  try {
    scaler_->load(scaler_archive);
  } catch (const c10::Error& e) {
    throw CheckpointError(
        fmt::format("checkpoint '{}': the GradScaler state does not fit: {}", path, e.what_without_backtrace()));
  }
}

}  // namespace fulgor::detail
