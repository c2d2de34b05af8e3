#pragma once

// Note [A pickle reader that runs nothing]
// Python's pickle is a small stack machine whose GLOBAL and REDUCE opcodes
// import and call anything; torch.load(weights_only=True) replaces them with an
// allow-list. This reader does the same with no Python at all: a GLOBAL names
// one of a fixed set of known functions and types (OrderedDict, the tensor
// rebuild functions, storage types, torch.Size, torch.device, dtypes, set,
// bytes), and REDUCE applies fulgor's own version of it. Any other global is
// refused by name before anything else happens; there is nothing to execute.
// What it builds are LibTorch values (c10::IValue): dicts (OrderedDict too)
// keep their order, sets and frozensets become lists, bytes become strings,
// torch.Size becomes a tuple of ints, dtypes become ints (c10::ScalarType),
// and integers beyond int64 become their decimal string (up to 4300 digits,
// Python's own int_max_str_digits: longer ones are refused).
//
// Note [Pickles from elsewhere]
// A pickle is a program, and one from elsewhere may be written to exhaust
// whatever reads it, so the reader bounds what the program can build:
//  - nesting: values nest at most kMaxPickleDepth deep (LibTorch's values are
//    freed, hashed and printed recursively: a 100000-deep tuple ends the
//    process on its stack);
//  - no cycles: a list or dict is filled while it is on top of the stack, as
//    every pickler writes it; one already placed inside another value is never
//    changed again, so no value contains itself and depths stay exact;
//  - the memo is dense: an index is one already written or the next, as
//    every pickler writes it, so the memo never outgrows the pickle;
//  - dict keys are strings, numbers, bools or tensors, which LibTorch
//    can hash;
//  - integers beyond int64 take time linear in their length to print.
// With these, time and memory are linear in the pickle's size.

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace fulgor::detail {

/// Resolves a persistent id (torch.save's ('storage', type, key, location,
/// numel) tuple) into a storage: a flat, one-dimensional tensor over all of
/// it, of the storage's dtype (uint8 for untyped storages).
using PersistentLoad = std::function<c10::IValue(const c10::IValue& persistent_id)>;

/// Whose pickles are read: Python's torch.save, or LibTorch's own archives
/// (torch::serialize::OutputArchive, torch::jit::save), whose pickles also
/// hold objects of TorchScript module classes and LibTorch's typed lists.
/// What an object of a module class is built from is read as a dict of its
/// attributes; the class's code is not: the archive's check of its code
/// records (archive/script_archive.h) keeps to classes without methods.
/// A distributed checkpoint's .metadata (Note [Distributed checkpoints] in
/// fulgor/interop/distributed_checkpoint.h) is a dialect of its own: its
/// dataclasses are read as dicts of their fields, the class's name under
/// "__class__", and nothing else is constructible.
enum class PickleDialect { torch_save, libtorch, distributed_checkpoint };

/// Note [Pickles from elsewhere]
constexpr size_t kMaxPickleDepth = 1000;
constexpr size_t kMaxIntegerDigits = 4300;

/// Runs the pickle `data` and returns the object it builds. `source` names it
/// in errors. Throws InteropError for a refused global or opcode, or a
/// malformed pickle, or one beyond the limits of Note [Pickles from
/// elsewhere].
c10::IValue read_pickle(const uint8_t* data, size_t size, const PersistentLoad& persistent_load,
                        const std::string& source, PickleDialect dialect = PickleDialect::torch_save);

/// The dtype a storage type is named for ("FloatStorage" is float32), for the
/// storage types torch.save writes; throws InteropError naming the others.
c10::ScalarType storage_dtype(const std::string& storage_type, const std::string& source);

}  // namespace fulgor::detail
