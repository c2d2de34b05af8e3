#include "trainer/callback_connector.h"

#include <algorithm>

#include "fulgor/callbacks/model_checkpoint.h"
#include "fulgor/callbacks/model_summary.h"
#include "fulgor/callbacks/on_exception_checkpoint.h"
#include "fulgor/callbacks/progress_bar.h"

namespace fulgor::detail {

std::vector<std::shared_ptr<Callback>> configure_callbacks(const TrainerOptions& o) {
  auto any = [&](bool (Callback::*ability)() const) {
    return std::any_of(o.callbacks.begin(), o.callbacks.end(), [&](const auto& cb) { return ((*cb).*ability)(); });
  };
  std::vector<std::shared_ptr<Callback>> callbacks;
  if (o.enable_model_summary && !any(&Callback::summarizes_model)) callbacks.push_back(std::make_shared<ModelSummary>());
  if (o.enable_progress_bar && !any(&Callback::shows_progress)) callbacks.push_back(std::make_shared<ProgressBar>());
  for (const auto& cb : o.callbacks)
    if (!cb->saves_checkpoints()) callbacks.push_back(cb);
  for (const auto& cb : o.callbacks)
    if (cb->saves_checkpoints()) callbacks.push_back(cb);
  if (o.enable_checkpointing && o.fast_dev_run == 0 && !any(&Callback::saves_checkpoints))
    callbacks.push_back(std::make_shared<ModelCheckpoint>());
  return callbacks;
}

ModelCheckpoint* find_model_checkpoint(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  for (const auto& cb : callbacks)
    if (auto* mc = dynamic_cast<ModelCheckpoint*>(cb.get())) return mc;
  return nullptr;
}

std::string checkpoint_dirpath(const ModelCheckpoint* checkpoint) { return checkpoint ? checkpoint->dirpath() : ""; }
std::string best_model_path(const ModelCheckpoint* checkpoint) {
  return checkpoint ? checkpoint->best_model_path() : "";
}

LastCheckpointPlaces last_checkpoint_places(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  LastCheckpointPlaces places;
  places.last_prefix = ModelCheckpoint::kCheckpointNameLast;
  for (const auto& cb : callbacks) {
    if (const auto* checkpoint = dynamic_cast<const ModelCheckpoint*>(cb.get());
        checkpoint && !checkpoint->dirpath().empty())
      places.folders.push_back(checkpoint->dirpath());
    if (const auto* on_exception = dynamic_cast<const OnExceptionCheckpoint*>(cb.get()))
      places.files.push_back(on_exception->ckpt_path());
  }
  return places;
}

}  // namespace fulgor::detail
