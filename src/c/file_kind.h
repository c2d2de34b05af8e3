#pragma once

// What a file given to the C API holds, told from its first bytes (and, for
// a zip archive, its list of records), so that a model given as a checkpoint
// or a checkpoint given as a model is refused saying what it is.

#include <string>

namespace fulgor::c_api {

enum class FileKind { unreadable, folder, checkpoint, torchscript, torch_save, safetensors, other };

struct FileInfo {
  FileKind kind;
  /// For a message: "a TorchScript file (...)", or why it cannot be read
  /// ("it cannot be opened: No such file or directory").
  std::string words;
};

/// Reads nothing of `path` beyond its head and a zip archive's directory;
/// runs nothing of it.
FileInfo inspect_file(const std::string& path);

}  // namespace fulgor::c_api
