// .safetensors files, read as read_safetensors reads them; what is read is
// written again and must read back the same.

#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "fulgor/core/error.h"
#include "fuzz.h"
#include "interop/safetensors_reader.h"

namespace fulgor::fuzz {

void safetensors(const uint8_t* data, size_t size) {
  Safetensors read;
  try {
    read = detail::read_safetensors_file(detail::MappedFile::copy_of(data, size, "fuzz input"));
  } catch (const Error&) {
    return;
  }
  auto path = std::filesystem::temp_directory_path() / ("fulgor_fuzz_" + std::to_string(getpid()) + ".safetensors");
  write_safetensors(read.tensors, path, read.metadata);
  Safetensors again = read_safetensors(path);
  std::filesystem::remove(path);
  require(again.tensors.size() == read.tensors.size() && again.metadata == read.metadata, "a round trip keeps names");
  // Compared as bytes: NaN payloads must survive too.
  auto bytes = [](const torch::Tensor& t) { return t.reshape(-1).contiguous().view(torch::kUInt8); };
  for (const auto& entry : read.tensors)
    require(torch::equal(bytes(again.tensors[entry.key()]), bytes(entry.value())), "a round trip keeps values");
}

}  // namespace fulgor::fuzz

FULGOR_FUZZ_TARGET(fulgor::fuzz::safetensors)
