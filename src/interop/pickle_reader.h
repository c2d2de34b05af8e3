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
// and integers beyond int64 become their decimal string (up to 4096 bytes of
// them: longer ones are refused).

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

/// Runs the pickle `data` and returns the object it builds. `source` names it
/// in errors. Throws InteropError for a refused global or opcode, or a
/// malformed pickle.
c10::IValue read_pickle(const uint8_t* data, size_t size, const PersistentLoad& persistent_load,
                        const std::string& source);

/// The dtype a storage type is named for ("FloatStorage" is float32), for the
/// storage types torch.save writes; throws InteropError naming the others.
c10::ScalarType storage_dtype(const std::string& storage_type, const std::string& source);

}  // namespace fulgor::detail
