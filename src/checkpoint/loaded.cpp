#include "checkpoint/loaded.h"

#include <fmt/format.h>

#include "checkpoint/checkpoint_file.h"
#include "checkpoint/meta.h"
#include "detail/tensor_moves.h"
#include "fulgor/checkpoint/checkpoint.h"
#include "fulgor/core/error.h"

namespace fulgor::detail {

LoadedCheckpoint load_checkpoint(const RegularFile& file, const std::string& path) {
  LoadedCheckpoint ckpt;
  ckpt.path = path;
  auto archive = std::make_shared<torch::serialize::InputArchive>(read_checkpoint_file(file, path));
  ckpt.meta = parse_checkpoint_meta(*archive, path);
  ckpt.archive = archive;
  ckpt.restore_weights = [archive, path](torch::nn::Module& module) {
    torch::serialize::InputArchive model_archive;
    if (!archive->try_read("model", model_archive))
      throw CheckpointError(fmt::format("checkpoint '{}' has no model state", path));
    load_module_state(module, model_archive, path);
  };
  const auto n_optimizers = ckpt.meta.at("optimizers").get<size_t>();  // checked by parse_checkpoint_meta
  ckpt.restore_optimizers = [archive, path, n_optimizers](const LoadedCheckpoint::Optimizers& optimizers,
                                                          const torch::nn::Module&, const Accelerator& accelerator,
                                                          torch::Device device) {
    if (n_optimizers != optimizers.size())
      throw CheckpointError(fmt::format("checkpoint '{}' holds {} optimizer states; configure_optimizers returned {}",
                                        path, n_optimizers, optimizers.size()));
    for (size_t i = 0; i < n_optimizers; ++i) {
      torch::serialize::InputArchive state;
      try {
        archive->read("optimizer_" + std::to_string(i), state);
        optimizers[i]->load(state);
      } catch (const c10::Error& e) {
        throw CheckpointError(
            fmt::format("checkpoint '{}': optimizer {} state does not fit: {}", path, i, e.what_without_backtrace()));
      }
      move_archive_tensors(state, accelerator, device, fmt::format("optimizer {} state", i));
    }
  };
  return ckpt;
}

}  // namespace fulgor::detail
