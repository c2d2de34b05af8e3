#pragma once

// What Trainer::fit returns: how the fit loop ended.

#include <cstdint>
#include <string>

#include "fulgor/core/export.h"

namespace fulgor {

/// Why fit returned.
enum class StopReason {
  max_epochs,  ///< max_epochs (or fast_dev_run's one epoch) completed
  max_steps,   ///< max_steps optimizer steps taken
  requested,   ///< a hook called request_stop (EarlyStopping, Timer, ...)
  signal,      ///< SIGINT or SIGTERM: a checkpoint was saved first
};
FULGOR_API std::string to_string(StopReason reason);

struct FitResult {
  StopReason reason = StopReason::max_epochs;
  std::string message;  ///< the reason in words
  int64_t epochs_completed = 0;
  int64_t global_step = 0;
  /// The checkpoint saved because of a signal; empty otherwise.
  std::string checkpoint_path;
};

}  // namespace fulgor
