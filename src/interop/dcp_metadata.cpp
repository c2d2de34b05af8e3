#include "interop/dcp_metadata.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "archive/pickle_reader.h"
#include "fulgor/core/error.h"

namespace fulgor::detail {
namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

// The opcodes of protocol 2 that the metadata needs; no memo (pickle.load
// does not need one).
class MetadataPickler {
 public:
  MetadataPickler() { out_ += "\x80\x02"; }
  std::string finish() { return std::move(out_ += '.'); }

  void global(const std::string& module, const std::string& name) { out_ += "c" + module + "\n" + name + "\n"; }
  void none() { out_ += 'N'; }
  void boolean(bool value) { out_ += value ? '\x88' : '\x89'; }
  void integer(int64_t value) {
    out_ += '\x8a';  // LONG1 of eight bytes
    out_ += '\x08';
    for (int i = 0; i < 8; ++i) out_ += static_cast<char>(static_cast<uint64_t>(value) >> (8 * i));
  }
  void string(const std::string& value) {
    out_ += 'X';
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>(value.size() >> (8 * i));
    out_ += value;
  }
  void mark() { out_ += '('; }
  void tuple() { out_ += 't'; }            // MARK ... TUPLE
  void empty_dict() { out_ += '}'; }
  void set_items() { out_ += 'u'; }        // MARK ... SETITEMS
  void empty_list() { out_ += ']'; }
  void append_items() { out_ += 'e'; }     // MARK ... APPENDS
  void reduce() { out_ += 'R'; }
  // NEWOBJ of a dataclass with no arguments; BUILD follows its state.
  void new_object(const std::string& module, const std::string& name) {
    global(module, name);
    out_ += ")\x81";
  }
  void build() { out_ += 'b'; }

  void size(const std::vector<int64_t>& dims) {  // torch.Size((...))
    global("torch", "Size");
    mark();
    mark();
    for (int64_t d : dims) integer(d);
    tuple();
    tuple();
    reduce();
  }
  void path_element(const c10::IValue& element) {
    if (element.isInt()) integer(element.toInt());
    else string(element.toStringRef());
  }

 private:
  std::string out_;
};

// Python's name of a dtype in the torch module.
std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kLong: return "int64";
    case c10::kInt: return "int32";
    case c10::kShort: return "int16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kBool: return "bool";
    case c10::kComplexFloat: return "complex64";
    case c10::kComplexDouble: return "complex128";
    default:
      throw InteropError(fmt::format("a tensor of dtype {} cannot be written into a distributed checkpoint",
                                     c10::toString(dtype)));
  }
}

void write_tensor_metadata(MetadataPickler& p, const DcpEntry& entry) {
  p.new_object(kMetadataModule, "TensorStorageMetadata");
  p.empty_dict();
  p.mark();
  p.string("properties");
  // TensorProperties's __getstate__: (dtype, layout, requires_grad,
  // memory_format, pin_memory), the memory format as _MEM_FORMAT_ENCODING.
  p.new_object(kMetadataModule, "TensorProperties");
  p.mark();
  p.global("torch", dtype_name(entry.dtype));
  p.global("torch.serialization", "_get_layout");
  p.mark();
  p.string("torch.strided");
  p.tuple();
  p.reduce();
  p.boolean(false);
  p.global(kMetadataModule, "_MEM_FORMAT_ENCODING");
  p.mark();
  p.integer(0);  // torch.contiguous_format
  p.tuple();
  p.reduce();
  p.boolean(false);
  p.tuple();
  p.build();
  p.string("size");
  p.size(entry.size);
  p.string("chunks");
  p.empty_list();
  p.mark();
  for (const DcpChunk& chunk : entry.chunks) {
    p.new_object(kMetadataModule, "ChunkStorageMetadata");
    p.empty_dict();
    p.mark();
    p.string("offsets");
    p.size(chunk.offsets);
    p.string("sizes");
    p.size(chunk.sizes);
    p.set_items();
    p.build();
  }
  p.append_items();
  p.set_items();
  p.build();
}

void write_storage(MetadataPickler& p, const std::string& fqn, const std::vector<int64_t>* offsets, size_t index,
                   const DcpStorage& storage) {
  p.new_object(kMetadataModule, "MetadataIndex");
  p.empty_dict();
  p.mark();
  p.string("fqn");
  p.string(fqn);
  p.string("offset");
  if (offsets) p.size(*offsets);
  else p.none();
  p.string("index");
  if (offsets) p.integer(static_cast<int64_t>(index));
  else p.none();
  p.set_items();
  p.build();
  p.new_object("torch.distributed.checkpoint.filesystem", "_StorageInfo");
  p.empty_dict();
  p.mark();
  p.string("relative_path");
  p.string(storage.relative_path);
  p.string("offset");
  p.integer(static_cast<int64_t>(storage.offset));
  p.string("length");
  p.integer(static_cast<int64_t>(storage.length));
  p.set_items();
  p.build();
}

// Reading: the dicts the dialect builds for the dataclasses.
class MetadataParser {
 public:
  explicit MetadataParser(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw InteropError(fmt::format("{}: {}", source_, what));
  }
  c10::impl::GenericDict object(const c10::IValue& value, const char* cls) const {
    if (!value.isGenericDict()) fail(fmt::format("expected a {}, found a {}", cls, value.tagKind()));
    auto dict = value.toGenericDict();
    auto name = dict.find("__class__");
    if (name == dict.end() || !name->value().isString() || name->value().toStringRef() != cls)
      fail(fmt::format("expected a {}", cls));
    return dict;
  }
  c10::IValue field(const c10::impl::GenericDict& object, const char* name, const char* cls) const {
    auto it = object.find(name);
    if (it == object.end()) fail(fmt::format("a {} has no field '{}'", cls, name));
    return it->value();
  }
  std::vector<int64_t> ints(const c10::IValue& value, const char* what) const {
    if (!value.isTuple()) fail(fmt::format("{} is not a torch.Size", what));
    std::vector<int64_t> out;
    for (const auto& element : value.toTupleRef().elements()) {
      if (!element.isInt()) fail(fmt::format("{} holds something other than ints", what));
      out.push_back(element.toInt());
    }
    return out;
  }
  uint64_t unsigned_int(const c10::IValue& value, const char* what) const {
    if (!value.isInt() || value.toInt() < 0) fail(fmt::format("a storage's {} is not a non-negative int", what));
    return static_cast<uint64_t>(value.toInt());
  }

  DcpEntry tensor_or_object(const std::string& fqn, const c10::IValue& value) const;
  c10::ScalarType dtype_of(const c10::IValue& properties) const;
  void attach_storage(DcpMetadata& metadata, const c10::IValue& item) const;

 private:
  const std::string& source_;
};

c10::ScalarType MetadataParser::dtype_of(const c10::IValue& properties) const {
  auto object = this->object(properties, "TensorProperties");
  c10::IValue dtype;
  auto state = object.find("__state__");
  if (state != object.end()) {
    if (!state->value().isTuple() || state->value().toTupleRef().elements().empty())
      fail("a TensorProperties's state is not a tuple starting with its dtype");
    dtype = state->value().toTupleRef().elements()[0];
  } else {
    dtype = field(object, "dtype", "TensorProperties");
  }
  if (!dtype.isInt()) fail("a TensorProperties's dtype is not a dtype");
  auto type = static_cast<c10::ScalarType>(dtype.toInt());
  dtype_name(type);  // refuses what cannot be read back either
  return type;
}

DcpEntry MetadataParser::tensor_or_object(const std::string& fqn, const c10::IValue& value) const {
  DcpEntry entry;
  entry.fqn = fqn;
  if (!value.isGenericDict()) fail(fmt::format("the metadata of '{}' is not a dataclass", fqn));
  auto dict = value.toGenericDict();
  auto cls = dict.find("__class__");
  if (cls != dict.end() && cls->value().isString() && cls->value().toStringRef() == "BytesStorageMetadata")
    return entry;
  auto tensor = object(value, "TensorStorageMetadata");
  entry.is_tensor = true;
  entry.dtype = dtype_of(field(tensor, "properties", "TensorStorageMetadata"));
  entry.size = ints(field(tensor, "size", "TensorStorageMetadata"), "a tensor's size");
  c10::IValue chunks = field(tensor, "chunks", "TensorStorageMetadata");
  if (!chunks.isList()) fail(fmt::format("the chunks of '{}' are not a list", fqn));
  if (chunks.toListRef().size() > kMaxChunks)
    fail(fmt::format("'{}' has {} chunks, more than the {} fulgor reads", fqn, chunks.toListRef().size(), kMaxChunks));
  for (const auto& chunk_value : chunks.toListRef()) {
    auto chunk = object(chunk_value, "ChunkStorageMetadata");
    entry.chunks.push_back(DcpChunk{ints(field(chunk, "offsets", "ChunkStorageMetadata"), "a chunk's offsets"),
                                    ints(field(chunk, "sizes", "ChunkStorageMetadata"), "a chunk's sizes"), {}});
  }
  return entry;
}

void MetadataParser::attach_storage(DcpMetadata& metadata, const c10::IValue& item) const {
  if (!item.isTuple() || item.toTupleRef().elements().size() != 2)
    fail("storage_data is not a dict from MetadataIndex to _StorageInfo");
  auto index = object(item.toTupleRef().elements()[0], "MetadataIndex");
  auto info = object(item.toTupleRef().elements()[1], "_StorageInfo");
  c10::IValue fqn = field(index, "fqn", "MetadataIndex");
  if (!fqn.isString()) fail("a MetadataIndex's fqn is not a string");
  c10::IValue path = field(info, "relative_path", "_StorageInfo");
  if (!path.isString()) fail("a _StorageInfo's relative_path is not a string");
  DcpStorage storage{path.toStringRef(), unsigned_int(field(info, "offset", "_StorageInfo"), "offset"),
                     unsigned_int(field(info, "length", "_StorageInfo"), "length")};
  auto entry = std::find_if(metadata.entries.begin(), metadata.entries.end(),
                            [&](const DcpEntry& e) { return e.fqn == fqn.toStringRef(); });
  if (entry == metadata.entries.end())
    fail(fmt::format("storage_data names '{}', which state_dict_metadata does not have", fqn.toStringRef()));
  auto offset_it = index.find("offset");
  bool has_offset = offset_it != index.end() && !offset_it->value().isNone();
  if (!entry->is_tensor) {
    if (has_offset) fail(fmt::format("the object '{}' is stored as a chunk", entry->fqn));
    if (!entry->object.relative_path.empty()) fail(fmt::format("'{}' is stored twice", entry->fqn));
    entry->object = storage;
    return;
  }
  if (!has_offset) fail(fmt::format("a chunk of the tensor '{}' is stored without its offsets", entry->fqn));
  std::vector<int64_t> offsets = ints(offset_it->value(), "a MetadataIndex's offset");
  auto chunk = std::find_if(entry->chunks.begin(), entry->chunks.end(),
                            [&](const DcpChunk& c) { return c.offsets == offsets; });
  if (chunk == entry->chunks.end())
    fail(fmt::format("storage_data has a chunk of '{}' at ({}), which its metadata does not list", entry->fqn,
                     fmt::join(offsets, ", ")));
  if (!chunk->storage.relative_path.empty())
    fail(fmt::format("the chunk of '{}' at ({}) is stored twice", entry->fqn, fmt::join(offsets, ", ")));
  chunk->storage = storage;
}

// Whether two boxes share an element.
bool overlap(const DcpChunk& a, const DcpChunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d)
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) return false;
  return true;
}

bool is_plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

void check_storage(const DcpStorage& storage, const std::string& what, const std::string& source) {
  if (storage.relative_path.empty())
    throw InteropError(fmt::format("{}: {} has no storage entry", source, what));
  if (!is_plain_name(storage.relative_path))
    throw InteropError(fmt::format("{}: {} is stored in '{}', which is not a file directly in the checkpoint's folder",
                                   source, what, storage.relative_path));
  if (storage.offset > UINT64_MAX - storage.length)
    throw InteropError(fmt::format("{}: {} lies past any file's end", source, what));
}

void check_tensor(const DcpEntry& entry, const std::string& source) {
  auto fail = [&](const std::string& what) {
    throw InteropError(fmt::format("{}: the tensor '{}' {}", source, entry.fqn, what));
  };
  int64_t numel = 1;
  for (int64_t d : entry.size)
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) fail("has a negative or overflowing size");
  int64_t covered = 0;
  for (const DcpChunk& chunk : entry.chunks) {
    if (chunk.offsets.size() != entry.size.size() || chunk.sizes.size() != entry.size.size())
      fail(fmt::format("has a chunk of {} dimensions in a tensor of {}", chunk.offsets.size(), entry.size.size()));
    int64_t volume = 1;
    for (size_t d = 0; d < entry.size.size(); ++d) {
      if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 || chunk.offsets[d] > entry.size[d] - chunk.sizes[d])
        fail(fmt::format("has a chunk at ({}) of ({}) outside its size ({})", fmt::join(chunk.offsets, ", "),
                         fmt::join(chunk.sizes, ", "), fmt::join(entry.size, ", ")));
      volume *= chunk.sizes[d];
    }
    covered += volume;  // bounded by numel once no two overlap
    check_storage(chunk.storage, fmt::format("the chunk of '{}' at ({})", entry.fqn, fmt::join(chunk.offsets, ", ")),
                  source);
  }
  // Sorted by their first offset, a chunk can only overlap those that start
  // before the end of its first dimension.
  std::vector<const DcpChunk*> sorted;
  for (const DcpChunk& chunk : entry.chunks)
    if (std::all_of(chunk.sizes.begin(), chunk.sizes.end(), [](int64_t s) { return s > 0; })) sorted.push_back(&chunk);
  if (!entry.size.empty())
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->offsets[0] < b->offsets[0]; });
  for (size_t i = 0; i < sorted.size(); ++i)
    for (size_t j = i + 1; j < sorted.size(); ++j) {
      if (!entry.size.empty() && sorted[j]->offsets[0] >= sorted[i]->offsets[0] + sorted[i]->sizes[0]) break;
      if (overlap(*sorted[i], *sorted[j]))
        fail(fmt::format("has overlapping chunks at ({}) and ({})", fmt::join(sorted[i]->offsets, ", "),
                         fmt::join(sorted[j]->offsets, ", ")));
    }
  if (covered != numel)
    fail(fmt::format("is covered by its chunks in {} of its {} elements", covered, numel));
}

}  // namespace

std::string write_dcp_metadata(const DcpMetadata& metadata) {
  MetadataPickler p;
  p.new_object(kMetadataModule, "Metadata");
  p.empty_dict();
  p.mark();
  p.string("state_dict_metadata");
  p.empty_dict();
  p.mark();
  for (const DcpEntry& entry : metadata.entries) {
    p.string(entry.fqn);
    if (entry.is_tensor) {
      write_tensor_metadata(p, entry);
    } else {
      p.new_object(kMetadataModule, "BytesStorageMetadata");
      p.empty_dict();
      p.build();
    }
  }
  p.set_items();
  p.string("planner_data");
  p.empty_dict();
  p.mark();
  for (const DcpEntry& entry : metadata.entries) {
    p.string(entry.fqn);
    p.mark();
    for (const auto& element : entry.path) p.path_element(element);
    p.tuple();
  }
  p.set_items();
  p.string("storage_data");
  p.empty_dict();
  p.mark();
  for (const DcpEntry& entry : metadata.entries) {
    if (!entry.is_tensor) write_storage(p, entry.fqn, nullptr, 0, entry.object);
    for (size_t i = 0; i < entry.chunks.size(); ++i)
      write_storage(p, entry.fqn, &entry.chunks[i].offsets, i, entry.chunks[i].storage);
  }
  p.set_items();
  p.string("storage_meta");
  p.none();
  p.set_items();
  p.build();
  return p.finish();
}

DcpMetadata read_dcp_metadata(const uint8_t* data, size_t size, const std::string& source) {
  PersistentLoad no_storages = [&](const c10::IValue&) -> c10::IValue {
    throw InteropError(fmt::format("{}: the metadata refers to a storage, which it never holds", source));
  };
  c10::IValue root = read_pickle(data, size, no_storages, source, PickleDialect::distributed_checkpoint);
  MetadataParser parser(source);
  auto top = parser.object(root, "Metadata");
  c10::IValue state = parser.field(top, "state_dict_metadata", "Metadata");
  if (!state.isGenericDict()) parser.fail("state_dict_metadata is not a dict");
  DcpMetadata metadata;
  for (const auto& item : state.toGenericDict()) {
    if (!item.key().isString()) parser.fail("state_dict_metadata has a key that is not a string");
    metadata.entries.push_back(parser.tensor_or_object(item.key().toStringRef(), item.value()));
  }
  auto planner = top.find("planner_data");
  if (planner != top.end() && planner->value().isGenericDict()) {
    for (const auto& item : planner->value().toGenericDict()) {
      if (!item.key().isString() || !item.value().isTuple()) continue;
      for (DcpEntry& entry : metadata.entries)
        if (entry.fqn == item.key().toStringRef()) {
          for (const auto& element : item.value().toTupleRef().elements())
            if (!element.isString() && !element.isInt())
              parser.fail(fmt::format("the path of '{}' holds something other than keys and indices", entry.fqn));
          entry.path = item.value().toTupleRef().elements().vec();
        }
    }
  }
  c10::IValue storage = parser.field(top, "storage_data", "Metadata");
  if (!storage.isGenericDict()) parser.fail("storage_data is not a dict");
  for (const auto& item : storage.toGenericDict()) parser.attach_storage(metadata, item.value());
  check_dcp_metadata(metadata, source);
  return metadata;
}

void check_dcp_metadata(const DcpMetadata& metadata, const std::string& source) {
  std::set<std::string> names;
  for (const DcpEntry& entry : metadata.entries) {
    if (!names.insert(entry.fqn).second)
      throw InteropError(fmt::format("{}: the key '{}' appears twice", source, entry.fqn));
    if (entry.is_tensor) check_tensor(entry, source);
    else check_storage(entry.object, fmt::format("the object '{}'", entry.fqn), source);
  }
}

}  // namespace fulgor::detail
