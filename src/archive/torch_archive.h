#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <optional>
#include <string>

#include "archive/pickle_reader.h"
#include "archive/zip_reader.h"

namespace fulgor::detail {

/// Reads the pickle record `folder + record` of `zip` (`folder` is "" or ends
/// in '/'), its storages from the records `folder + "data/" + key`, each
/// checked to hold exactly the elements its persistent id says, and loaded
/// onto `map_location` (empty: the CPU, aliasing the file).
c10::IValue read_archive_pickle(const ZipReader& zip, const std::string& folder, const std::string& record,
                                const std::optional<c10::Device>& map_location, PickleDialect dialect);

}  // namespace fulgor::detail
