#include "fulgor/interop/torch_load.h"

#include <fmt/format.h>
#include <torch/types.h>

#include <algorithm>
#include <memory>
#include <string>

#include "archive/torch_archive.h"
#include "fulgor/core/error.h"
#include "interop/torch_load_archive.h"

namespace fulgor {
namespace detail {
namespace {

// The folder every record of a torch.save archive sits in: PyTorchStreamWriter
// names it after the file, Python after the file too, so it is looked up.
std::string archive_folder(const ZipReader& zip) {
  for (const auto& [name, record] : zip.records()) {
    auto slash = name.find('/');
    if (slash != std::string::npos && name.compare(slash, std::string::npos, "/data.pkl") == 0)
      return name.substr(0, slash + 1);
  }
  if (zip.has("constants.pkl") || std::any_of(zip.records().begin(), zip.records().end(), [](const auto& r) {
        return r.first.find("/constants.pkl") != std::string::npos;
      }))
    throw InteropError(fmt::format("'{}' is a TorchScript archive (torch.jit.save or torch::save), not a torch.save "
                                   "file; load it with torch::jit::load",
                                   zip.file()->name()));
  throw InteropError(fmt::format("'{}' is a zip archive without data.pkl, not a torch.save file", zip.file()->name()));
}

}  // namespace

c10::IValue torch_load_archive(const std::shared_ptr<MappedFile>& file, const TorchLoadOptions& options) {
  ZipReader zip(file);
  if (options.verify_checksums) zip.verify();
  std::string folder = archive_folder(zip);
  if (zip.has(folder + "byteorder")) {
    size_t size = 0;
    const uint8_t* order = zip.read(folder + "byteorder", &size);
    if (std::string(reinterpret_cast<const char*>(order), size) != "little")
      throw InteropError(fmt::format("'{}' was saved on a big-endian machine; fulgor reads little-endian files",
                                     file->name()));
  }
  return read_archive_pickle(zip, folder, "data.pkl", options.map_location, PickleDialect::torch_save);
}

}  // namespace detail

c10::IValue torch_load(const std::filesystem::path& path, const TorchLoadOptions& options) {
  auto file = detail::MappedFile::open(path);
  if (!detail::looks_like_zip(file->data(), file->size())) {
    bool legacy = file->size() >= 2 && file->data()[0] == 0x80;  // a bare pickle: torch.save before 1.6
    throw InteropError(fmt::format("'{}' is not a torch.save zip archive{}", path.string(),
                                   legacy ? " (it looks like the legacy format of torch before 1.6, or "
                                            "_use_new_zipfile_serialization=False; save it again with a newer torch)"
                                          : ""));
  }
  return detail::torch_load_archive(file, options);
}

}  // namespace fulgor
