#include "archive/torch_archive.h"

#include <fmt/format.h>
#include <torch/types.h>

#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "fulgor/core/error.h"

namespace fulgor::detail {
namespace {

// The storages of one archive, each loaded once so that every tensor over it
// shares it.
class StorageLoader {
 public:
  StorageLoader(const ZipReader& zip, std::string folder, const std::optional<c10::Device>& map_location)
      : zip_(zip), folder_(std::move(folder)), map_location_(map_location) {}

  c10::IValue operator()(const c10::IValue& id);

 private:
  torch::Tensor load(const std::string& key, c10::ScalarType dtype, int64_t numel);
  const ZipReader& zip_;
  std::string folder_;
  const std::optional<c10::Device>& map_location_;
  std::map<std::string, torch::Tensor> loaded_;
};

c10::IValue StorageLoader::operator()(const c10::IValue& id) {
  const std::string& file = zip_.file()->name();
  if (!id.isTuple() || id.toTupleRef().elements().size() != 5)
    throw InteropError(fmt::format("'{}': a persistent id that is not ('storage', type, key, location, numel)", file));
  const std::vector<c10::IValue> e = id.toTupleRef().elements().vec();
  if (!e[0].isString() || e[0].toStringRef() != "storage" || !e[1].isString() || !e[2].isString() ||
      !e[3].isString() || !e[4].isInt() || e[4].toInt() < 0)
    throw InteropError(fmt::format("'{}': a persistent id that is not ('storage', type, key, location, numel)", file));
  // The location (cpu, cuda:1, npu:0, ...) is where it was saved from; it is
  // loaded where the options say, so a device this machine lacks is no obstacle.
  c10::ScalarType dtype = storage_dtype(e[1].toStringRef(), "'" + file + "'");
  const std::string& key = e[2].toStringRef();
  auto it = loaded_.find(key);
  if (it == loaded_.end()) it = loaded_.emplace(key, load(key, dtype, e[4].toInt())).first;
  if (it->second.scalar_type() != dtype || it->second.numel() != e[4].toInt())
    throw InteropError(fmt::format("'{}': storage '{}' is named with two dtypes or sizes", file, key));
  return it->second;
}

torch::Tensor StorageLoader::load(const std::string& key, c10::ScalarType dtype, int64_t numel) {
  const std::string& file = zip_.file()->name();
  size_t size = 0;
  uint8_t* data = zip_.read(folder_ + "data/" + key, &size);
  size_t element = c10::elementSize(dtype);
  if (size / element != static_cast<uint64_t>(numel) || size % element != 0)
    throw InteropError(fmt::format("'{}': storage '{}' holds {} bytes, not the {} elements of {} its tensors need",
                                   file, key, size, numel, c10::toString(dtype)));
  auto options = torch::TensorOptions().dtype(dtype);
  torch::Tensor flat;
  if (reinterpret_cast<uintptr_t>(data) % element == 0) {
    // Note [Reading the zip ourselves]: the storage aliases the mapping, which
    // lives as long as any tensor over it.
    c10::Storage storage(c10::Storage::use_byte_size_t(), size, aliasing_data_ptr(zip_.file(), data), nullptr, false);
    flat = torch::empty({0}, options).set_(storage, 0, {numel}, {1});
  } else {  // a zip writer that does not align records, unlike torch's
    flat = torch::empty({numel}, options);
    std::memcpy(flat.data_ptr(), data, size);
  }
  return map_location_ ? flat.to(*map_location_) : flat;
}

}  // namespace

c10::IValue read_archive_pickle(const ZipReader& zip, const std::string& folder, const std::string& record,
                                const std::optional<c10::Device>& map_location, PickleDialect dialect) {
  size_t size = 0;
  const uint8_t* pickle = zip.read(folder + record, &size);
  StorageLoader storages(zip, folder, map_location);
  return read_pickle(pickle, size, std::ref(storages), fmt::format("'{}', record '{}{}'", zip.file()->name(), folder, record),
                     dialect);
}

}  // namespace fulgor::detail
