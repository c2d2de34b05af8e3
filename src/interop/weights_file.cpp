#include "fulgor/interop/weights_file.h"

#include <fmt/format.h>
#include <torch/serialize/input-archive.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "checkpoint/checkpoint_file.h"
#include "detail/read_at.h"
#include "detail/regular_file.h"
#include "fulgor/core/error.h"
#include "fulgor/interop/safetensors.h"
#include "fulgor/interop/torch_load.h"
#include "fulgor/interop/torch_save.h"
#include "interop/safetensors_reader.h"
#include "interop/torch_load_archive.h"

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

// A weights file, open (Note [Opening a user's path]), and what is told of
// it from its first bytes; a torch.save file is loaded once, to tell a
// Lightning checkpoint from it.
struct OpenWeights {
  detail::RegularFile file;
  WeightsFormat format = WeightsFormat::torch_save;
  c10::IValue loaded;
};

OpenWeights open_weights(const std::string& path) {
  OpenWeights open;
  open.file = detail::open_regular<InteropError>(path, "weights file");
  char head[9] = {};
  const auto size = std::min<uint64_t>(open.file.size(), 9);
  if (!detail::read_at(open.file.fd(), 0, head, size))
    throw InteropError(
        fmt::format("weights file '{}' cannot be read: {}", path, errno != 0 ? std::strerror(errno) : "it shrank"));
  if (size >= 8 && std::string(head, 8) == "FULGORCK") {
    open.format = WeightsFormat::fulgor_checkpoint;
  } else if (size >= 4 && std::string(head, 4) == "PK\x03\x04") {
    open.loaded = detail::torch_load_archive(detail::MappedFile::map(open.file, path, 0, UINT64_MAX), {});
    open.format = is_lightning(open.loaded) ? WeightsFormat::lightning : WeightsFormat::torch_save;
  } else if (size == 9 && head[8] == '{') {
    open.format = WeightsFormat::safetensors;
  } else {
    throw InteropError(
        fmt::format("'{}' is none of the formats fulgor reads: torch.save (a zip archive), Lightning "
                    "checkpoint, fulgor checkpoint (FULGORCK), safetensors (a JSON header)",
                    path));
  }
  return open;
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

WeightsFormat detect_weights_format(const std::filesystem::path& path) { return open_weights(path.string()).format; }

StateDict read_weights(const std::filesystem::path& path, WeightsFormat* format) {
  const std::string name = path.string();
  const OpenWeights open = open_weights(name);
  if (format != nullptr) *format = open.format;
  switch (open.format) {
    case WeightsFormat::safetensors:
      return detail::read_safetensors_file(detail::MappedFile::map(open.file, name, 0, UINT64_MAX)).tensors;
    case WeightsFormat::fulgor_checkpoint: {
      auto archive = detail::read_checkpoint_file(open.file, name);
      torch::serialize::InputArchive model;
      if (!archive.try_read("model", model))
        throw InteropError(fmt::format("fulgor checkpoint '{}' has no model state", name));
      StateDict out;
      flatten(model, "", out);
      return out;
    }
    default:
      return state_dict_from(open.loaded, "'" + name + "'");
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
