#pragma once

// Note [Archives that hold no code]
// fulgor's checkpoints are LibTorch archives (torch::serialize::OutputArchive,
// written by torch::jit's module exporter). Besides pickles and tensor
// records, such an archive holds a code/ record for each module class:
// TorchScript source that LibTorch compiles as it loads the archive, and
// whose __setstate__, where a class defines one, LibTorch's unpickler runs
// for each object of the class. A file from elsewhere may hold any code
// there, and a pickle that crashes LibTorch's unpickler (a million-deep
// tuple) or asks it for gigabytes (a memo index of 2^32). So before LibTorch
// parses an archive from a file, check_script_archive checks that it holds
// what OutputArchive writes, read by fulgor alone:
//  - records: data.pkl, constants.pkl, version, byteorder, .data/version,
//    .data/serialization_id, tensor data (data/N) and code of module classes
//    (code/__torch__.py, code/__torch__/___torch_mangle_N.py, with their
//    .debug_pkl), all in one folder, not overlapping; data stored, code
//    stored or deflated (LibTorch deflates it) to at most 16 MiB;
//  - code: one `class Module(Module):` per record whose body only declares
//    attributes (parameter and buffer names, `name : Type`,
//    `__annotations__["name"] = Type`) of plain types: no method, so nothing
//    to run;
//  - pickles: read by fulgor's pickle reader (Note [A pickle reader that runs
//    nothing]) in its LibTorch dialect, within its limits (Note [Pickles from
//    elsewhere]): the globals are the tensor rebuild, storages, OrderedDict,
//    torch.device, complex, LibTorch's typed lists and type tags (of plain
//    types), and the archive's own module classes;
//  - each storage record holds exactly the bytes its tensors are said to
//    need, and each tensor lies inside its storage.
// LibTorch then reads the same bytes (a checkpoint's chunk hashes hold them
// to what was checked).

#include <memory>
#include <string>
#include <string_view>

#include "archive/zip_reader.h"

namespace fulgor::detail {

/// Whether `qualified` names a module class an archive may define
/// ("__torch__.Module", "__torch__.___torch_mangle_3.Module").
bool is_archive_module_class(std::string_view qualified);

/// Whether `type` is a TorchScript type of plain values: Tensor, str, int,
/// float, bool, complex, NoneType, Device, Any, Optional/List/Dict/Tuple of
/// those, or an archive's module class.
bool is_data_type(std::string_view type);

/// Checks that `archive` (a zip archive, named by its file) holds data only
/// (Note [Archives that hold no code]); throws InteropError naming the file,
/// the record and what was refused.
void check_script_archive(const std::shared_ptr<MappedFile>& archive);

}  // namespace fulgor::detail
