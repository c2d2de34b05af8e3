#include "fulgor/interop/weights_file.h"

#include <fmt/format.h>
#include <torch/serialize/input-archive.h>
#include <xxhash.h>

#include <fstream>

#include "fulgor/checkpoint/checkpoint.h"
#include "fulgor/core/error.h"
#include "fulgor/interop/safetensors.h"
#include "fulgor/interop/torch_load.h"
#include "fulgor/interop/torch_save.h"

namespace fulgor {
namespace {

// A fulgor checkpoint's "model": one archive per submodule (Module::save),
// tensors at each level.
void flatten(torch::serialize::InputArchive& archive, const std::string& prefix, StateDict& out) {
  for (const std::string& key : archive.keys()) {
    torch::Tensor tensor;
    torch::serialize::InputArchive child;
    if (archive.try_read(key, tensor) || archive.try_read(key, tensor, /*is_buffer=*/true)) {
      out.insert(prefix + key, tensor);
    } else if (archive.try_read(key, child)) {
      flatten(child, prefix + key + ".", out);
    }
  }
}

bool is_lightning(const c10::IValue& loaded) {
  return loaded.isGenericDict() && loaded.toGenericDict().contains(std::string("pytorch-lightning_version"));
}

}  // namespace

std::string to_string(WeightsFormat format) {
  switch (format) {
    case WeightsFormat::torch_save: return "torch.save";
    case WeightsFormat::lightning: return "Lightning checkpoint";
    case WeightsFormat::fulgor_checkpoint: return "fulgor checkpoint";
    case WeightsFormat::safetensors: return "safetensors";
  }
  return "unknown";
}

WeightsFormat detect_weights_format(const std::filesystem::path& path) {
  char head[9] = {};
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InteropError(fmt::format("cannot open '{}'", path.string()));
  in.read(head, 9);
  if (in.gcount() >= 8 && std::string(head, 8) == "FULGORCK") return WeightsFormat::fulgor_checkpoint;
  if (in.gcount() >= 4 && std::string(head, 4) == "PK\x03\x04")
    return is_lightning(torch_load(path)) ? WeightsFormat::lightning : WeightsFormat::torch_save;
  if (in.gcount() == 9 && head[8] == '{') return WeightsFormat::safetensors;
  throw InteropError(fmt::format("'{}' is none of the formats fulgor reads: torch.save (a zip archive), Lightning "
                                 "checkpoint, fulgor checkpoint (FULGORCK), safetensors (a JSON header)",
                                 path.string()));
}

StateDict read_weights(const std::filesystem::path& path, WeightsFormat* format) {
  WeightsFormat detected = detect_weights_format(path);
  if (format != nullptr) *format = detected;
  switch (detected) {
    case WeightsFormat::safetensors: return read_safetensors(path).tensors;
    case WeightsFormat::fulgor_checkpoint: {
      auto archive = read_checkpoint_file(path.string());
      torch::serialize::InputArchive model;
      if (!archive.try_read("model", model))
        throw InteropError(fmt::format("fulgor checkpoint '{}' has no model state", path.string()));
      StateDict out;
      flatten(model, "", out);
      return out;
    }
    default: return state_dict_from(torch_load(path), "'" + path.string() + "'");
  }
}

void write_weights(const StateDict& state, const std::filesystem::path& path) {
  std::string extension = path.extension().string();
  if (extension == ".safetensors") return write_safetensors(state, path);
  if (extension == ".pt" || extension == ".pth" || extension == ".bin") return save_state_dict(state, path);
  throw InteropError(fmt::format("cannot write '{}': extension '{}' names no format fulgor writes weights in; "
                                 "accepted: .safetensors, .pt, .pth, .bin",
                                 path.string(), extension));
}

uint64_t tensor_checksum(const torch::Tensor& tensor) {
  torch::Tensor t = tensor.detach().cpu().contiguous();
  return XXH3_64bits(t.data_ptr(), t.nbytes());
}

}  // namespace fulgor
