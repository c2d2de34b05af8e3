#include "fulgor/interop/torch_save.h"

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>

#include "detail/regular_file.h"
#include "fulgor/core/error.h"
#include "interop/pickle_writer.h"
#include "interop/torch_save_bytes.h"

namespace fulgor {
namespace {

// The records of a torch.save archive, by LibTorch's zip writer (which names
// the archive's folder "archive", as Python does for a stream).
void write_records(detail::PickleWriter& writer, const std::function<size_t(const void*, size_t)>& sink) {
  std::string pickle = writer.finish();
  caffe2::serialize::PyTorchStreamWriter zip(sink);
  zip.writeRecord("data.pkl", pickle.data(), pickle.size());
  zip.writeRecord("byteorder", "little", 6);
  for (const auto& storage : writer.storages())
    zip.writeRecord("data/" + storage.key, storage.flat.data_ptr(), storage.flat.nbytes());
  zip.writeEndOfFile();
}

// The records into a temporary file renamed over `path` once complete.
void write_archive(detail::PickleWriter& writer, const std::filesystem::path& path) {
  detail::check_output<InteropError>(path.string());
  std::filesystem::path temporary = path;
  temporary += fmt::format(".tmp{}", getpid());
  std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
  if (!out) throw InteropError(fmt::format("cannot write '{}': cannot create '{}'", path.string(), temporary.string()));
  try {
    write_records(writer, [&](const void* data, size_t size) {
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
      return out ? size : 0;
    });
    out.close();
    if (!out) throw InteropError(fmt::format("cannot write '{}': the disk refused the data", path.string()));
    std::error_code renamed;
    std::filesystem::rename(temporary, path, renamed);
    if (renamed) throw InteropError(fmt::format("cannot write '{}': {}", path.string(), renamed.message()));
  } catch (const c10::Error& e) {
    std::filesystem::remove(temporary);
    throw InteropError(fmt::format("cannot write '{}': {}", path.string(), e.what_without_backtrace()));
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
}

}  // namespace

void torch_save(const c10::IValue& value, const std::filesystem::path& path) {
  detail::PickleWriter writer;
  writer.write(value);
  write_archive(writer, path);
}

void save_state_dict(const StateDict& state, const std::filesystem::path& path) {
  detail::PickleWriter writer;
  writer.write_ordered(state);
  write_archive(writer, path);
}

void save_state_dict(const torch::nn::Module& module, const std::filesystem::path& path) {
  save_state_dict(state_dict_of(module), path);
}

namespace detail {

void torch_save_to(const c10::IValue& value, const std::function<size_t(const void*, size_t)>& sink) {
  PickleWriter writer;
  writer.write(value);
  try {
    write_records(writer, sink);
  } catch (const c10::Error& e) {
    throw InteropError(fmt::format("cannot write a torch.save archive: {}", e.what_without_backtrace()));
  }
}

std::string torch_save_bytes(const c10::IValue& value) {
  std::string archive;
  torch_save_to(value, [&](const void* data, size_t size) {
    archive.append(static_cast<const char*>(data), size);
    return size;
  });
  return archive;
}

}  // namespace detail

}  // namespace fulgor
