#pragma once

#include <ATen/core/ivalue.h>

#include <memory>

#include "fulgor/interop/torch_load.h"
#include "interop/pickle_reader.h"
#include "interop/zip_reader.h"

namespace fulgor::detail {

/// torch_load of a file already in memory (the fuzzers' inputs are).
c10::IValue torch_load_archive(const std::shared_ptr<MappedFile>& file, const TorchLoadOptions& options);

/// Reads the pickle record `folder + record` of `zip` (`folder` is "" or ends
/// in '/'), its storages from the records `folder + "data/" + key`, each
/// checked to hold exactly the elements its persistent id says.
c10::IValue read_archive_pickle(const ZipReader& zip, const std::string& folder, const std::string& record,
                                const TorchLoadOptions& options, PickleDialect dialect);

}  // namespace fulgor::detail
