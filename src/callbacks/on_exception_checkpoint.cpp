#include "fulgor/callbacks/on_exception_checkpoint.h"

#include <fmt/format.h>

#include <filesystem>

#include "fulgor/core/error.h"
#include "fulgor/trainer.h"

namespace fulgor {

OnExceptionCheckpoint::OnExceptionCheckpoint(std::string dirpath, std::string filename)
    : dirpath_(std::move(dirpath)), filename_(std::move(filename)) {
  if (filename_.empty())
    throw ConfigError("OnExceptionCheckpoint: filename is empty; expected a file name without its extension");
}

std::string OnExceptionCheckpoint::ckpt_path() const {
  return (std::filesystem::path(dirpath_) / (filename_ + ".ckpt")).string();
}

void OnExceptionCheckpoint::on_exception(Trainer& trainer, ModuleBase&, const std::exception&) {
  trainer.save_checkpoint(ckpt_path());
}

void OnExceptionCheckpoint::teardown(Trainer& trainer, ModuleBase&, const std::string&) {
  if (!trainer.is_global_zero()) return;
  std::error_code ignored;  // as Lightning's remove_checkpoint, a missing file is fine
  std::filesystem::remove(ckpt_path(), ignored);
}

}  // namespace fulgor
