#pragma once

#include <string>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// Saves a checkpoint when a run ends by an exception (Lightning's
/// OnExceptionCheckpoint), to `dirpath`/`filename`.ckpt, so that the work
/// done so far can be resumed with `ckpt_path`.
///
/// Contract: on_exception saves through Trainer::save_checkpoint, replacing
/// a file of that name; a run that ends normally removes it in teardown (rank
/// 0 under ddp), as the file would otherwise resume a run that is done. It is
/// a checkpointing callback (saves_checkpoints()): it runs after the others,
/// and where it is given the Trainer adds no default ModelCheckpoint, as
/// Lightning's Checkpoint callbacks. An empty `filename` is a ConfigError. A
/// stop by a signal (Ctrl-C) is not an exception in fulgor: the fit ends
/// cleanly, with ModelCheckpoint's saves, and this callback removes its file.
class FULGOR_API OnExceptionCheckpoint : public Callback {
 public:
  explicit OnExceptionCheckpoint(std::string dirpath, std::string filename = "on_exception");

  bool saves_checkpoints() const override { return true; }
  void on_exception(Trainer& trainer, ModuleBase& module, const std::exception& exception) override;
  void teardown(Trainer& trainer, ModuleBase& module, const std::string& stage) override;

  /// `dirpath`/`filename`.ckpt.
  std::string ckpt_path() const;

 private:
  std::string dirpath_;
  std::string filename_;
};

}  // namespace fulgor
