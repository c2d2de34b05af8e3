#include "c/file_kind.h"

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fulgor/interop/distributed_checkpoint.h"

namespace fulgor::c_api {
namespace {

// A TorchScript file (torch.jit.save, torch::save) and a torch.save file are
// both zip archives of pickles; only TorchScript's hold constants.pkl.
FileInfo inspect_zip(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (reader.hasRecord("constants.pkl"))
      return {FileKind::torchscript, "a TorchScript file (torch.jit.save of a model, for fulgor_model_create)"};
    if (reader.hasRecord("data.pkl"))
      return {FileKind::torch_save, "a torch.save file (tensors or weights saved from Python)"};
  } catch (const std::exception&) {
  }
  return {FileKind::other, "a zip archive of neither TorchScript nor torch.save"};
}

}  // namespace

FileInfo inspect_file(const std::string& path) {
  std::error_code ec;
  if (is_distributed_checkpoint(path))
    return {FileKind::checkpoint,
            "a fulgor sharded checkpoint (a distributed checkpoint's folder, as fulgor_save "
            "writes with \"state_dict_type\": \"sharded\")"};
  if (std::filesystem::is_directory(path, ec)) return {FileKind::folder, "a folder"};
  std::ifstream in(path, std::ios::binary);
  if (!in) return {FileKind::unreadable, fmt::format("it cannot be opened: {}", std::strerror(errno))};
  char head[9] = {};
  in.read(head, sizeof head);
  const std::string start(head, static_cast<size_t>(in.gcount()));
  if (start.rfind("FULGORCK", 0) == 0)
    return {FileKind::checkpoint, "a fulgor checkpoint (tensors and JSON, as fulgor_save writes)"};
  if (start.rfind("PK\x03\x04", 0) == 0) return inspect_zip(path);
  if (start.size() == 9 && start[8] == '{') return {FileKind::safetensors, "a safetensors file (weights alone)"};
  return {FileKind::other, start.empty() ? "an empty file" : "a file in none of the formats fulgor reads"};
}

}  // namespace fulgor::c_api
