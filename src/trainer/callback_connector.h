#pragma once

// Lightning's _CallbackConnector: the built-in callbacks the Trainer adds as
// its options ask (a ModelSummary, a ProgressBar, a ModelCheckpoint), and the
// ModelCheckpoint it finds among its callbacks. The callbacks sit above the
// Trainer (docs/architecture.md), so these are declared here, for the
// Trainer, and defined with them, in src/callbacks/callback_connector.cpp.

#include <memory>
#include <string>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/config/trainer_options.h"

namespace fulgor {
class ModelCheckpoint;
}

namespace fulgor::detail {

// The options' callbacks with the built-in ones they ask for, in the order
// the Trainer calls them: those that save checkpoints last, so that they save
// what the others did.
std::vector<std::shared_ptr<Callback>> configure_callbacks(const TrainerOptions& options);
// The first ModelCheckpoint of `callbacks`, or nullptr.
ModelCheckpoint* find_model_checkpoint(const std::vector<std::shared_ptr<Callback>>& callbacks);
// The dirpath and the best_model_path of `checkpoint`; "" for none.
std::string checkpoint_dirpath(const ModelCheckpoint* checkpoint);
std::string best_model_path(const ModelCheckpoint* checkpoint);

// Where `callbacks` save what ckpt_path="last" may mean (Note [Resolving
// "last"] in checkpoint_connector.cpp): each ModelCheckpoint's folder, whose
// files named `last_prefix`... are candidates, and each
// OnExceptionCheckpoint's file.
struct LastCheckpointPlaces {
  std::string last_prefix;
  std::vector<std::string> folders, files;
};
LastCheckpointPlaces last_checkpoint_places(const std::vector<std::shared_ptr<Callback>>& callbacks);

}  // namespace fulgor::detail
