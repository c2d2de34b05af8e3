#include "interop/pickle_writer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstring>

#include "fulgor/core/error.h"

namespace fulgor::detail {
namespace {

const char* storage_type(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "FloatStorage";
    case c10::kDouble: return "DoubleStorage";
    case c10::kHalf: return "HalfStorage";
    case c10::kBFloat16: return "BFloat16Storage";
    case c10::kLong: return "LongStorage";
    case c10::kInt: return "IntStorage";
    case c10::kShort: return "ShortStorage";
    case c10::kChar: return "CharStorage";
    case c10::kByte: return "ByteStorage";
    case c10::kBool: return "BoolStorage";
    case c10::kComplexFloat: return "ComplexFloatStorage";
    case c10::kComplexDouble: return "ComplexDoubleStorage";
    default:
      throw InteropError(fmt::format("a tensor of dtype {} cannot be written for torch.load; accepted: float32, "
                                     "float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool, complex",
                                     c10::toString(dtype)));
  }
}

}  // namespace

PickleWriter::PickleWriter() {
  op(0x80);  // PROTO
  op(2);
}

void PickleWriter::global(const char* module, const char* name) {
  op('c');
  out_ += fmt::format("{}\n{}\n", module, name);
}

void PickleWriter::integer(int64_t value) {
  if (value >= 0 && value < 256) {
    op('K');
    op(static_cast<uint8_t>(value));
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    op('J');
    auto v = static_cast<uint32_t>(static_cast<int32_t>(value));
    for (int i = 0; i < 4; ++i) op(static_cast<uint8_t>(v >> (8 * i)));
  } else {
    op(0x8a);  // LONG1, eight bytes of two's complement
    op(8);
    auto v = static_cast<uint64_t>(value);
    for (int i = 0; i < 8; ++i) op(static_cast<uint8_t>(v >> (8 * i)));
  }
}

void PickleWriter::string(const std::string& value) {
  op('X');  // BINUNICODE
  auto n = static_cast<uint32_t>(value.size());
  for (int i = 0; i < 4; ++i) op(static_cast<uint8_t>(n >> (8 * i)));
  out_ += value;
}

void PickleWriter::int_tuple(c10::IntArrayRef values) {
  op('(');
  for (int64_t v : values) integer(v);
  op('t');
}

// _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, OrderedDict()),
// the storage a persistent id ('storage', type, key, 'cpu', numel).
void PickleWriter::tensor(const torch::Tensor& t) {
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  auto it = storage_index_.find(impl);
  const char* type = storage_type(t.scalar_type());
  size_t element = c10::elementSize(t.scalar_type());
  if (it == storage_index_.end()) {
    auto numel = static_cast<int64_t>(t.storage().nbytes() / element);
    torch::Tensor flat = torch::empty({0}, t.options()).set_(t.storage(), 0, {numel}, {1}).cpu();
    it = storage_index_.emplace(impl, storages_.size()).first;
    storages_.push_back({std::to_string(storages_.size()), flat});
  }
  const PickledStorage& storage = storages_[it->second];
  if (storage.flat.scalar_type() != t.scalar_type())
    throw InteropError(fmt::format("two tensors share a storage as {} and {}; torch.load's typed storages cannot say so",
                                   c10::toString(storage.flat.scalar_type()), c10::toString(t.scalar_type())));
  global("torch._utils", "_rebuild_tensor_v2");
  op('(');
  op('(');
  string("storage");
  global("torch", type);
  string(storage.key);
  string("cpu");
  integer(storage.flat.numel());
  op('t');
  op('Q');  // BINPERSID
  integer(t.storage_offset());
  int_tuple(t.sizes());
  int_tuple(t.strides());
  op(t.requires_grad() ? 0x88 : 0x89);
  global("collections", "OrderedDict");
  op(')');
  op('R');
  op('t');
  op('R');
}

void PickleWriter::write(const c10::IValue& value) {
  if (value.isTensor()) return tensor(value.toTensor());
  if (value.isNone()) return op('N');
  if (value.isBool()) return op(value.toBool() ? 0x88 : 0x89);
  if (value.isInt()) return integer(value.toInt());
  if (value.isString()) return string(value.toStringRef());
  if (value.isDouble()) {
    op('G');  // BINFLOAT, big-endian
    double d = value.toDouble();
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    for (int i = 7; i >= 0; --i) op(static_cast<uint8_t>(bits >> (8 * i)));
    return;
  }
  if (value.isList()) {
    op(']');
    op('(');
    for (const auto& element : value.toListRef()) write(element);
    return op('e');
  }
  if (value.isTuple()) {
    op('(');
    for (const auto& element : value.toTupleRef().elements()) write(element);
    return op('t');
  }
  if (value.isGenericDict()) {
    op('}');
    op('(');
    for (const auto& entry : value.toGenericDict()) {
      write(entry.key());
      write(entry.value());
    }
    return op('u');
  }
  throw InteropError(fmt::format("a value of type {} cannot be written for torch.load; accepted: dicts, lists, "
                                 "tuples, strings, ints, floats, bools, None and tensors",
                                 value.tagKind()));
}

void PickleWriter::write_ordered(const StateDict& state) {
  global("collections", "OrderedDict");
  op(')');
  op('R');
  op('(');
  for (const auto& entry : state) {
    string(entry.key());
    tensor(entry.value());
  }
  op('u');
}

std::string PickleWriter::finish() {
  op('.');
  return std::move(out_);
}

}  // namespace fulgor::detail
