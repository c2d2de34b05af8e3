// torch.save files and bare pickles, read as torch_load reads them.
//
// An input that starts as a zip archive ("PK\3\4") is a whole torch.save
// file; any other input is a pickle run by the restricted pickle reader, whose
// storages (persistent ids) all resolve to one small float storage, so that
// the tensor rebuild functions are reached without an archive around them.

#include <torch/torch.h>

#include "archive/pickle_reader.h"
#include "fulgor/core/error.h"
#include "fuzz.h"
#include "interop/torch_load_archive.h"

namespace fulgor::fuzz {

void torch_file(const uint8_t* data, size_t size) {
  try {
    if (detail::looks_like_zip(data, size)) {
      auto file = detail::MappedFile::copy_of(data, size, "fuzz input");
      c10::IValue loaded = detail::torch_load_archive(file, {});
      require(!loaded.isTensor() || loaded.toTensor().defined(), "a loaded tensor is defined");
      return;
    }
    torch::Tensor storage = torch::arange(16, torch::kFloat32);
    auto storages = [&](const c10::IValue&) -> c10::IValue { return storage; };
    c10::IValue value = detail::read_pickle(data, size, storages, "fuzz input");
    if (value.isTensor()) require(value.toTensor().storage().nbytes() == 64, "a tensor stays on its storage");
  } catch (const Error&) {
  }
}

}  // namespace fulgor::fuzz

FULGOR_FUZZ_TARGET(fulgor::fuzz::torch_file)
