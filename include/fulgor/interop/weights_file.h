#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "fulgor/core/export.h"
#include "fulgor/interop/state_dict.h"

namespace fulgor {

/// The files of weights fulgor reads, told apart by their content.
enum class WeightsFormat {
  torch_save,         ///< torch.save of a state dict or a {state_dict}/{model} container (.pt, .pth, .bin)
  lightning,          ///< a Lightning .ckpt (a torch.save with "pytorch-lightning_version")
  fulgor_checkpoint,  ///< a fulgor checkpoint (Note [Checkpoint files]); its "model"
  safetensors,        ///< a .safetensors file
};

/// "torch.save", "Lightning checkpoint", "fulgor checkpoint", "safetensors".
FULGOR_API std::string to_string(WeightsFormat format);

/// The format of `path`, from its first bytes (and, for a torch.save file,
/// whether it is Lightning's). Throws InteropError naming the file when it is
/// none of them.
FULGOR_API WeightsFormat detect_weights_format(const std::filesystem::path& path);

/// The tensors of any WeightsFormat file, by the names Python's state_dict()
/// gives them (a fulgor checkpoint's nested module archives become dotted
/// names). Sets `*format` when given.
FULGOR_API StateDict read_weights(const std::filesystem::path& path, WeightsFormat* format = nullptr);

/// Writes `state` in the format `path`'s extension names: .safetensors, or a
/// torch.save state dict for .pt, .pth and .bin. Throws InteropError for
/// another extension, naming those accepted.
FULGOR_API void write_weights(const StateDict& state, const std::filesystem::path& path);

/// XXH3-64 of the tensor's values in row-major order, as `xxhsum -H3` prints
/// it for a file of those bytes.
FULGOR_API uint64_t tensor_checksum(const torch::Tensor& tensor);

}  // namespace fulgor
