#include "archive/pickle_reader.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/types.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

#include "archive/script_archive.h"
#include "fulgor/core/error.h"

namespace fulgor::detail {
namespace {

// The globals a pickle may name, each with fulgor's version of what calling
// it does (Note [A pickle reader that runs nothing]).
enum class Callable {
  none,
  ordered_dict,
  rebuild_tensor,
  rebuild_tensor_v2,
  rebuild_tensor_v3,
  rebuild_parameter,
  rebuild_parameter_with_state,
  rebuild_from_type_v2,
  size,
  device,
  set,
  frozenset,
  bytearray,
  codecs_encode,
  tensor_type,
  // LibTorch's archives only (PickleDialect::libtorch).
  script_module,
  typed_list,
  type_tag,
  complex,
  // Distributed checkpoints' metadata only (PickleDialect::distributed_checkpoint).
  dcp_class,
  layout,
  memory_format_encoding,
  enum_member,
  path,
};

const std::map<std::string, Callable>& callables() {
  static const std::map<std::string, Callable> table = {
      {"collections.OrderedDict", Callable::ordered_dict},
      {"torch._utils._rebuild_tensor", Callable::rebuild_tensor},
      {"torch._utils._rebuild_tensor_v2", Callable::rebuild_tensor_v2},
      {"torch._utils._rebuild_tensor_v3", Callable::rebuild_tensor_v3},
      {"torch._utils._rebuild_parameter", Callable::rebuild_parameter},
      {"torch._utils._rebuild_parameter_with_state", Callable::rebuild_parameter_with_state},
      {"torch._tensor._rebuild_from_type_v2", Callable::rebuild_from_type_v2},
      {"torch.Size", Callable::size},
      {"torch.device", Callable::device},
      {"builtins.set", Callable::set},
      {"builtins.frozenset", Callable::frozenset},
      {"builtins.bytearray", Callable::bytearray},
      {"_codecs.encode", Callable::codecs_encode},
      {"torch.Tensor", Callable::tensor_type},
      {"torch.nn.parameter.Parameter", Callable::tensor_type},
  };
  return table;
}

// What LibTorch's Pickler (torch/csrc/jit/serialization/pickler.cpp, 1.13 to
// 2.6) names besides the tensor rebuild, storages, OrderedDict and
// torch.device: typed lists, a dict's or list's type, complex numbers, and
// the module classes of the archive (below).
const std::map<std::string, Callable>& libtorch_callables() {
  static const std::map<std::string, Callable> table = {
      {"torch.jit._pickle.build_intlist", Callable::typed_list},
      {"torch.jit._pickle.build_tensorlist", Callable::typed_list},
      {"torch.jit._pickle.build_doublelist", Callable::typed_list},
      {"torch.jit._pickle.build_boollist", Callable::typed_list},
      {"torch.jit._pickle.restore_type_tag", Callable::type_tag},
      {"builtins.complex", Callable::complex},
  };
  return table;
}

// What the .metadata of PyTorch's distributed checkpoints names
// (torch/distributed/checkpoint/metadata.py and filesystem.py, 1.13 to 2.6;
// 1.13 keeps TensorProperties in torch.distributed._shard): the dataclasses,
// built with NEWOBJ and BUILD, the layout and memory format of
// TensorProperties's state, and StorageMeta's checkpoint_id, a path.
const std::map<std::string, Callable>& dcp_callables() {
  static const std::map<std::string, Callable> table = [] {
    std::map<std::string, Callable> t;
    // 2.x's modules, then 1.13's prototype's.
    for (const char* module : {"torch.distributed.checkpoint", "torch.distributed._shard.checkpoint"}) {
      for (const char* name : {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                               "TensorProperties", "MetadataIndex", "StorageMeta"})
        t[fmt::format("{}.metadata.{}", module, name)] = Callable::dcp_class;
      t[fmt::format("{}.filesystem._StorageInfo", module)] = Callable::dcp_class;
    }
    t["torch.distributed._shard.sharded_tensor.metadata.TensorProperties"] = Callable::dcp_class;
    t["torch.serialization._get_layout"] = Callable::layout;
    t["torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING"] = Callable::memory_format_encoding;
    t["torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING"] = Callable::memory_format_encoding;
    // An enum member by name, as Python 3.11 and 3.12 pickle it.
    t["builtins.getattr"] = Callable::enum_member;
    t["pathlib.PosixPath"] = Callable::path;
    t["pathlib.WindowsPath"] = Callable::path;
    t["pathlib._local.PosixPath"] = Callable::path;  // Python 3.13
    t["pathlib._local.WindowsPath"] = Callable::path;
    return t;
  }();
  return table;
}

const std::map<std::string, c10::ScalarType>& dtypes() {
  using S = c10::ScalarType;
  static const std::map<std::string, c10::ScalarType> table = {
      {"float32", S::Float}, {"float", S::Float},          {"float64", S::Double},     {"double", S::Double},
      {"float16", S::Half},  {"half", S::Half},            {"bfloat16", S::BFloat16},  {"int64", S::Long},
      {"long", S::Long},     {"int32", S::Int},            {"int", S::Int},            {"int16", S::Short},
      {"short", S::Short},   {"int8", S::Char},            {"uint8", S::Byte},         {"bool", S::Bool},
      {"complex64", S::ComplexFloat}, {"cfloat", S::ComplexFloat}, {"complex128", S::ComplexDouble},
      {"cdouble", S::ComplexDouble},
  };
  return table;
}

// One stack or memo entry: a value, or a global fulgor knows how to call
// (whose value is then its qualified name), and how deep it nests (for a
// list or dict, PickleReader::containers_ keeps the depth instead).
struct Item {
  c10::IValue value;
  Callable callable = Callable::none;
  size_t depth = 0;
};

bool is_mutable(const c10::IValue& value) { return value.isList() || value.isGenericDict(); }

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()); }
c10::impl::GenericList new_list() { return c10::impl::GenericList(c10::AnyType::get()); }

// The decimal digits of a little-endian two's-complement integer too wide for
// int64, as Python prints it: nine digits at a time, by long division of
// 32-bit words.
std::string decimal_of(std::vector<uint8_t> bytes) {
  bool negative = (bytes.back() & 0x80) != 0;
  if (negative) {  // magnitude = ~x + 1
    unsigned carry = 1;
    for (uint8_t& b : bytes) {
      unsigned v = static_cast<uint8_t>(~b) + carry;
      b = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
  }
  std::vector<uint32_t> words((bytes.size() + 3) / 4, 0);
  for (size_t i = 0; i < bytes.size(); ++i) words[i / 4] |= static_cast<uint32_t>(bytes[i]) << (8 * (i % 4));
  std::vector<uint32_t> groups;  // base 10^9, least significant first
  while (!words.empty() && words.back() == 0) words.pop_back();
  while (!words.empty()) {
    uint64_t remainder = 0;
    for (auto it = words.rbegin(); it != words.rend(); ++it) {
      uint64_t v = (remainder << 32) | *it;
      *it = static_cast<uint32_t>(v / 1000000000u);
      remainder = v % 1000000000u;
    }
    groups.push_back(static_cast<uint32_t>(remainder));
    while (!words.empty() && words.back() == 0) words.pop_back();
  }
  std::string digits = negative ? "-" : "";
  digits += groups.empty() ? "0" : std::to_string(groups.back());
  for (size_t i = groups.size() > 1 ? groups.size() - 1 : 0; i-- > 0;) digits += fmt::format("{:09d}", groups[i]);
  return digits;
}

// Python's str.encode('latin1'), which protocol 2 uses to carry bytes.
std::string latin1_of(const std::string& utf8, const std::string& source) {
  std::string out;
  for (size_t i = 0; i < utf8.size(); ++i) {
    auto c = static_cast<uint8_t>(utf8[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if ((c & 0xE0) == 0xC0 && c <= 0xC3 && i + 1 < utf8.size()) {
      out.push_back(static_cast<char>(((c & 0x1F) << 6) | (static_cast<uint8_t>(utf8[++i]) & 0x3F)));
    } else {
      throw InteropError(fmt::format("{}: _codecs.encode of a string that is not latin-1", source));
    }
  }
  return out;
}

class PickleReader {
 public:
  PickleReader(const uint8_t* data, size_t size, const PersistentLoad& persistent_load, const std::string& source,
               PickleDialect dialect)
      : data_(data), size_(size), persistent_load_(persistent_load), source_(source), dialect_(dialect) {}

  c10::IValue run();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InteropError(fmt::format("{}: {} (at byte {} of the pickle)", source_, what, at_));
  }
  const uint8_t* take(size_t n) {
    if (size_ - at_ < n) fail("the pickle is truncated");
    const uint8_t* p = data_ + at_;
    at_ += n;
    return p;
  }
  uint64_t little(size_t n) {
    const uint8_t* p = take(n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
  }
  std::string text(size_t n) {
    const uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  std::string line() {
    const void* end = std::memchr(data_ + at_, '\n', size_ - at_);
    if (end == nullptr) fail("the pickle is truncated in a GLOBAL");
    size_t n = static_cast<const uint8_t*>(end) - (data_ + at_);
    std::string s = text(n);
    ++at_;
    return s;
  }
  Item pop() {
    if (stack_.size() <= floor()) fail("an opcode pops an empty stack");
    Item item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }
  c10::IValue pop_value() { return pop().value; }
  // Note [Pickles from elsewhere]: the depth of what `item` holds.
  size_t depth_of(const Item& item) { return is_mutable(item.value) ? container(item.value).depth : item.depth; }
  // Places `item` inside another value: its depth is final from here on.
  size_t place(const Item& item) {
    if (is_mutable(item.value)) container(item.value).placed = true;
    return depth_of(item);
  }
  size_t place_all(const std::vector<Item>& items) {
    size_t deepest = 0;
    for (const Item& item : items) deepest = std::max(deepest, place(item));
    return deepest;
  }
  // Pushes a value made of values `child_depth` deep.
  void push_made(c10::IValue value, size_t child_depth, Callable callable = Callable::none) {
    size_t depth = child_depth + 1;
    if (depth > kMaxPickleDepth)
      fail(fmt::format("values nest deeper than {} levels, more than fulgor reads", kMaxPickleDepth));
    if (is_mutable(value)) containers_.insert_or_assign(value.internalToPointer(), Container{depth, false, value});
    stack_.push_back(Item{std::move(value), callable, depth});
  }
  // Adds values `child_depth` deep to the list or dict on top of the stack.
  void grow_top(size_t child_depth) {
    Container& top_container = container(top().value);
    if (top_container.placed)
      fail("a list or dict is changed after it was placed inside another value (a recursive structure), "
           "which fulgor does not read");
    top_container.depth = std::max(top_container.depth, child_depth + 1);
    if (top_container.depth > kMaxPickleDepth)
      fail(fmt::format("values nest deeper than {} levels, more than fulgor reads", kMaxPickleDepth));
  }
  Item& top() {
    if (stack_.size() <= floor()) fail("an opcode needs a value on an empty stack");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<Item> pop_to_mark();
  static std::vector<c10::IValue> values(std::vector<Item> items) {
    std::vector<c10::IValue> out;
    out.reserve(items.size());
    for (Item& item : items) out.push_back(std::move(item.value));
    return out;
  }
  void push(c10::IValue value) { push_made(std::move(value), 0); }
  void push_integer(size_t bytes);
  void push_global(const std::string& module, const std::string& name);
  void memo_put(uint64_t index);
  void check_key(const c10::IValue& key);
  void new_object();
  void build_object();
  void memo_get(uint64_t index);
  bool step(uint8_t op);
  bool push_literal(uint8_t op);
  bool build_container(uint8_t op);
  void reduce();
  c10::IValue call(Callable callable, const std::vector<c10::IValue>& args);
  c10::IValue call_for_value(Callable callable, const std::vector<c10::IValue>& args);
  c10::IValue memory_format(const std::vector<c10::IValue>& args);
  c10::IValue list_of(const c10::IValue& value);
  std::string string_arg(const std::vector<c10::IValue>& args, size_t i);
  c10::IValue rebuild_tensor(const std::vector<c10::IValue>& args, size_t dtype_at);
  std::vector<int64_t> ints(const c10::IValue& value, const char* what);

  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
  const PersistentLoad& persistent_load_;
  const std::string& source_;
  PickleDialect dialect_;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::vector<Item> memo_;
  struct Container {
    size_t depth;
    bool placed;
    c10::IValue kept;  // alive, so that no later list or dict takes its address
  };
  // Every list and dict built so far, by identity (Note [Pickles from elsewhere]).
  std::unordered_map<const void*, Container> containers_;
  Container& container(const c10::IValue& value) {
    auto it = containers_.find(value.internalToPointer());
    if (it == containers_.end()) fail("a list or dict of unknown origin");
    return it->second;
  }
};

std::vector<Item> PickleReader::pop_to_mark() {
  if (marks_.empty()) fail("an opcode needs a mark and there is none");
  size_t mark = marks_.back();
  marks_.pop_back();
  std::vector<Item> items(std::make_move_iterator(stack_.begin() + static_cast<ptrdiff_t>(mark)),
                          std::make_move_iterator(stack_.end()));
  stack_.resize(mark);
  return items;
}

void PickleReader::memo_put(uint64_t index) {
  if (index > memo_.size())
    fail(fmt::format("memo entry {} is written while the memo has {}: a pickler writes the next one", index,
                     memo_.size()));
  if (index == memo_.size())
    memo_.push_back(top());
  else
    memo_[index] = top();
}

// Note [Pickles from elsewhere]: keys LibTorch's dicts can hash (c10's
// DictKeyHash), which None is not: its hash throws inside the dict's insert,
// where the exception ends the process.
void PickleReader::check_key(const c10::IValue& key) {
  if (!(key.isString() || key.isInt() || key.isDouble() || key.isBool() || key.isTensor()))
    fail(fmt::format("a dict key of type {}; fulgor reads dicts keyed by strings, numbers, bools or tensors",
                     key.tagKind()));
}

// NEWOBJ of a module class of a LibTorch archive: its attributes, a dict
// that BUILD fills.
// NEWOBJ of a module class of a LibTorch archive or of a distributed
// checkpoint's dataclass: its attributes, a dict that BUILD fills; the
// dataclass's name is kept under "__class__".
void PickleReader::new_object() {
  Item args = pop();
  Item type = pop();
  bool known = type.callable == Callable::script_module || type.callable == Callable::dcp_class;
  if (!known || !args.value.isTuple() || !args.value.toTupleRef().elements().empty())
    fail("NEWOBJ of something other than a module class of the archive or a distributed checkpoint's dataclass");
  auto object = new_dict();
  if (type.callable == Callable::dcp_class) object.insert("__class__", type.value);
  push_made(object, 0);
}

// BUILD of a dataclass made by NEWOBJ: its state is the dict of its fields,
// or (TensorProperties's __getstate__) a tuple, kept under "__state__".
void PickleReader::build_object() {
  Item state = pop();
  Item& object = top();
  if (!object.value.isGenericDict() || !object.value.toGenericDict().contains("__class__"))
    fail("BUILD on something other than a dataclass of the metadata");
  grow_top(place(state));
  auto fields = object.value.toGenericDict();
  if (state.value.isGenericDict()) {
    for (const auto& field : state.value.toGenericDict()) {
      if (!field.key().isString() || field.key().toStringRef() == "__class__")
        fail("a dataclass's state has a field that is not a name");
      fields.insert_or_assign(field.key(), field.value());
    }
  } else if (state.value.isTuple()) {
    fields.insert_or_assign("__state__", state.value);
  } else {
    fail("a dataclass's state is neither a dict nor a tuple");
  }
}

void PickleReader::push_integer(size_t bytes) {
  // Python prints at most 4300 digits (int_max_str_digits); 1785 bytes hold
  // at most 4299.
  constexpr size_t kMaxIntegerBytes = 1785;
  static_assert(kMaxIntegerDigits == 4300);
  if (bytes > kMaxIntegerBytes)
    fail(fmt::format("an integer of {} bytes; fulgor reads integers of up to {} bytes ({} digits, as Python prints)",
                     bytes, kMaxIntegerBytes, kMaxIntegerDigits));
  const uint8_t* p = take(bytes);
  if (bytes == 0) return push(int64_t{0});
  bool negative = (p[bytes - 1] & 0x80) != 0;
  bool fits = true;
  for (size_t i = 8; i < bytes; ++i) fits = fits && p[i] == (negative ? 0xFF : 0x00);
  if (bytes > 8 && fits) fits = ((p[7] & 0x80) != 0) == negative;
  if (!fits) return push(decimal_of(std::vector<uint8_t>(p, p + bytes)));
  uint64_t v = negative ? ~uint64_t{0} : 0;
  for (size_t i = std::min<size_t>(bytes, 8); i-- > 0;) v = (v << 8) | p[i];
  push(static_cast<int64_t>(v));
}

void PickleReader::push_global(const std::string& raw_module, const std::string& name) {
  // Protocol 2 writes Python 3's builtins under their Python 2 name.
  std::string module = raw_module == "__builtin__" ? "builtins" : raw_module;
  std::string qualified = module + "." + name;
  auto callable = callables().find(qualified);
  if (callable != callables().end()) return push_made(qualified, 0, callable->second);
  if (dialect_ == PickleDialect::libtorch) {
    auto libtorch = libtorch_callables().find(qualified);
    if (libtorch != libtorch_callables().end()) return push_made(qualified, 0, libtorch->second);
    if (is_archive_module_class(qualified)) return push_made(qualified, 0, Callable::script_module);
  }
  if (dialect_ == PickleDialect::distributed_checkpoint) {
    auto dcp = dcp_callables().find(qualified);
    if (dcp != dcp_callables().end()) return push_made(name, 0, dcp->second);
  }
  if (module == "torch") {
    auto dtype = dtypes().find(name);
    if (dtype != dtypes().end()) return push(dtype->second);
    if (dialect_ == PickleDialect::distributed_checkpoint &&
        (name == "strided" || name == "contiguous_format" || name == "channels_last" || name == "preserve_format"))
      return push(qualified);
    if (name.size() > 7 && name.compare(name.size() - 7, 7, "Storage") == 0) return push(qualified);
  }
  if (dialect_ == PickleDialect::distributed_checkpoint)
    fail(fmt::format("the pickle names the global '{}', which fulgor refuses to load: a distributed checkpoint's "
                     "metadata names only the classes of torch.distributed.checkpoint's metadata, torch.Size, "
                     "dtypes, layouts and memory formats",
                     qualified));
  if (dialect_ == PickleDialect::libtorch)
    fail(fmt::format("the pickle names the global '{}', which fulgor refuses to load: only tensors, storages, "
                     "typed lists and dicts, complex numbers, torch.device and the archive's own module classes "
                     "(__torch__.Module, __torch__.___torch_mangle_N.Module) are accepted",
                     qualified));
  fail(fmt::format("the pickle names the global '{}', which fulgor refuses to load: only tensors, storages, "
                   "OrderedDict, set, bytes, torch.Size, torch.device and dtypes are accepted, as "
                   "torch.load(weights_only=True) accepts",
                   qualified));
}

void PickleReader::memo_get(uint64_t index) {
  if (index >= memo_.size()) fail(fmt::format("memo entry {} is read before it is written", index));
  stack_.push_back(memo_[index]);
}

std::vector<int64_t> PickleReader::ints(const c10::IValue& value, const char* what) {
  if (!value.isTuple()) fail(fmt::format("a tensor's {} is not a tuple", what));
  std::vector<int64_t> out;
  for (const auto& element : value.toTupleRef().elements()) {
    if (!element.isInt()) fail(fmt::format("a tensor's {} holds something other than ints", what));
    out.push_back(element.toInt());
  }
  return out;
}

// _rebuild_tensor(storage, offset, size, stride, ...), its dtype at
// args[dtype_at] for _v3 (whose storage is untyped) and the storage's own
// otherwise. Every element it reaches must lie inside the storage.
c10::IValue PickleReader::rebuild_tensor(const std::vector<c10::IValue>& args, size_t dtype_at) {
  if (args.size() < 4 || !args[0].isTensor() || !args[1].isInt())
    fail("a tensor rebuild call does not have (storage, offset, size, stride)");
  torch::Tensor storage = args[0].toTensor();
  c10::ScalarType dtype = storage.scalar_type();
  if (dtype_at != 0) {
    if (args.size() <= dtype_at || !args[dtype_at].isInt()) fail("_rebuild_tensor_v3 without a dtype");
    dtype = static_cast<c10::ScalarType>(args[dtype_at].toInt());
    if (std::none_of(dtypes().begin(), dtypes().end(), [&](const auto& d) { return d.second == dtype; }))
      fail(fmt::format("_rebuild_tensor_v3 with an unknown dtype {}", args[dtype_at].toInt()));
  }
  int64_t offset = args[1].toInt();
  std::vector<int64_t> sizes = ints(args[2], "size"), strides = ints(args[3], "stride");
  if (sizes.size() != strides.size()) fail("a tensor's size and stride differ in length");
  int64_t capacity = static_cast<int64_t>(storage.nbytes() / c10::elementSize(dtype));
  int64_t last = offset;
  bool empty = false, overflow = offset < 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0 || strides[i] < 0) fail("a tensor has a negative size or stride");
    empty = empty || sizes[i] == 0;
    int64_t reach = 0;
    overflow = overflow || __builtin_mul_overflow(sizes[i] == 0 ? 0 : sizes[i] - 1, strides[i], &reach) ||
               __builtin_add_overflow(last, reach, &last);
  }
  if (overflow || (!empty && last >= capacity) || offset > capacity)
    fail(fmt::format("a tensor of size {} and stride {} at offset {} reaches past its storage of {} elements",
                     fmt::join(sizes, "x"), fmt::join(strides, ","), offset, capacity));
  return torch::empty({0}, storage.options().dtype(dtype)).set_(storage.storage(), offset, sizes, strides);
}

std::string PickleReader::string_arg(const std::vector<c10::IValue>& args, size_t i) {
  if (args.size() <= i || !args[i].isString()) fail("a call's argument is not a string");
  return args[i].toStringRef();
}

// The calls that make tensors and what describes them; the rest make plain
// values (call_for_value).
c10::IValue PickleReader::call(Callable callable, const std::vector<c10::IValue>& args) {
  switch (callable) {
    case Callable::rebuild_tensor:
    case Callable::rebuild_tensor_v2:
      return rebuild_tensor(args, 0);
    case Callable::rebuild_tensor_v3:
      return rebuild_tensor(args, 6);
    case Callable::rebuild_parameter:
    case Callable::rebuild_parameter_with_state: {
      if (args.size() < 2 || !args[0].isTensor() || !args[1].isBool()) fail("_rebuild_parameter without (data, requires_grad)");
      torch::Tensor data = args[0].toTensor();
      if (args[1].toBool()) data.set_requires_grad(true);
      return data;
    }
    case Callable::rebuild_from_type_v2: {
      // (function, type, args, state): the function must be one of the
      // rebuild functions, the type Tensor or Parameter, the state ignored.
      auto named = [&](size_t i) {
        return args.size() == 4 && args[i].isString() ? callables().find(args[i].toStringRef()) : callables().end();
      };
      auto function = named(0), type = named(1);
      if (function == callables().end() || type == callables().end() || type->second != Callable::tensor_type ||
          !args[2].isTuple())
        fail("_rebuild_from_type_v2 of something other than a tensor");
      return call(function->second, args[2].toTupleRef().elements().vec());
    }
    case Callable::size: {
      if (args.size() != 1) fail("torch.Size takes one tuple");
      std::vector<c10::IValue> dims;
      for (int64_t d : ints(args[0], "torch.Size")) dims.emplace_back(d);
      return c10::ivalue::Tuple::create(std::move(dims));
    }
    case Callable::device: {
      std::string name = string_arg(args, 0);
      if (args.size() == 2 && args[1].isInt()) name += ":" + std::to_string(args[1].toInt());
      try {
        return c10::Device(name);
      } catch (const c10::Error&) {
        return name;  // a device this LibTorch cannot name (npu, say), kept as its string
      }
    }
    default:
      return call_for_value(callable, args);
  }
}

c10::IValue PickleReader::call_for_value(Callable callable, const std::vector<c10::IValue>& args) {
  switch (callable) {
    case Callable::ordered_dict:
      if (!args.empty()) fail("OrderedDict called with arguments");
      return new_dict();
    case Callable::set:
    case Callable::frozenset:
      return args.empty() ? new_list() : list_of(args[0]);
    case Callable::bytearray:
      return args.empty() ? std::string() : string_arg(args, 0);
    case Callable::codecs_encode:
      return latin1_of(string_arg(args, 0), source_);
    case Callable::typed_list:
      if (args.size() != 1 || !args[0].isList()) fail("a typed list of something other than a list");
      return args[0];
    case Callable::type_tag: {
      // The type is parsed by LibTorch when the archive is loaded: only
      // types of plain values pass (archive/script_archive.h).
      if (args.size() != 2 || !(args[0].isList() || args[0].isGenericDict()) || !args[1].isString())
        fail("restore_type_tag of something other than a list or dict and its type");
      if (!is_data_type(args[1].toStringRef()))
        fail(fmt::format("restore_type_tag names the type '{}', which is not one of plain values",
                         args[1].toStringRef()));
      return args[0];
    }
    case Callable::complex:
      if (args.size() != 2 || !args[0].isDouble() || !args[1].isDouble()) fail("complex of other than two floats");
      return c10::complex<double>(args[0].toDouble(), args[1].toDouble());
    case Callable::layout:  // _get_layout("torch.strided")
      return string_arg(args, 0);
    case Callable::memory_format_encoding:  // an enum of ints
      if (args.size() != 1 || !args[0].isInt()) fail("a memory format's encoding is not an int");
      return args[0];
    case Callable::enum_member:
      return memory_format(args);
    case Callable::path: {
      std::string joined;
      for (size_t i = 0; i < args.size(); ++i) joined += (i ? "/" : "") + string_arg(args, i);
      return joined;
    }
    default:
      fail("a call of something that is not an accepted function");
  }
}

// getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")
c10::IValue PickleReader::memory_format(const std::vector<c10::IValue>& args) {
  static const std::map<std::string, int64_t> formats = {
      {"TORCH_CONTIGUOUS_FORMAT", 0}, {"TORCH_CHANNELS_LAST", 1}, {"TORCH_PRESERVE_FORMAT", 2}};
  bool encoding = args.size() == 2 && args[0].isString() &&
                  (args[0].toStringRef() == "_MEM_FORMAT_ENCODING" || args[0].toStringRef() == "MEM_FORMAT_ENCODING");
  auto format = encoding && args[1].isString() ? formats.find(args[1].toStringRef()) : formats.end();
  if (format == formats.end()) fail("getattr of something other than a memory format's encoding");
  return format->second;
}

c10::IValue PickleReader::list_of(const c10::IValue& value) {
  auto out = new_list();
  if (value.isList())
    out.append(value.toList());
  else if (value.isTuple())
    for (const auto& e : value.toTupleRef().elements()) out.push_back(e);
  else
    fail("set() of something that is not a list");
  return out;
}

void PickleReader::reduce() {
  Item args = pop();
  Item function = pop();
  if (function.callable == Callable::none || function.callable == Callable::script_module ||
      function.callable == Callable::dcp_class || !args.value.isTuple())
    fail("REDUCE of something other than an accepted global and a tuple of arguments");
  // What a call returns holds at most what its arguments held.
  size_t depth = place(args);
  c10::IValue result = call(function.callable, args.value.toTupleRef().elements().vec());
  if (is_mutable(result) && containers_.count(result.internalToPointer()) != 0)
    stack_.push_back(Item{std::move(result)});  // a list or dict of the arguments, passed through
  else
    push_made(std::move(result), depth > 0 ? depth - 1 : 0);
}

// The opcodes that push a constant.
bool PickleReader::push_literal(uint8_t op) {
  switch (op) {
    case 'N': push(c10::IValue()); break;
    case 0x88: push(true); break;   // NEWTRUE
    case 0x89: push(false); break;  // NEWFALSE
    case 'J': push(static_cast<int64_t>(static_cast<int32_t>(little(4)))); break;  // BININT
    case 'K': push(static_cast<int64_t>(little(1))); break;                        // BININT1
    case 'M': push(static_cast<int64_t>(little(2))); break;                        // BININT2
    case 0x8a: push_integer(little(1)); break;                                     // LONG1
    case 0x8b: push_integer(little(4)); break;                                     // LONG4
    case 'G': {  // BINFLOAT, big-endian
      const uint8_t* p = take(8);
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
      double v;
      std::memcpy(&v, &bits, 8);
      push(v);
      break;
    }
    case 'X': case 'T': case 'B': push(text(little(4))); break;  // BINUNICODE, BINSTRING, BINBYTES
    case 0x8c: case 'U': case 'C': push(text(little(1))); break;  // SHORT_BINUNICODE, SHORT_BINSTRING, SHORT_BINBYTES
    case 0x8d: case 0x8e: case 0x96: {                            // BINUNICODE8, BINBYTES8, BYTEARRAY8
      uint64_t n = little(8);
      if (n > size_) fail("a string longer than the pickle");
      push(text(n));
      break;
    }
    default: return false;
  }
  return true;
}

// The opcodes that make or fill tuples, lists, dicts and sets.
bool PickleReader::build_container(uint8_t op) {
  auto tuple_of = [&](std::vector<Item> items) {
    size_t depth = place_all(items);
    push_made(c10::ivalue::Tuple::create(values(std::move(items))), depth);
  };
  auto pop_items = [&](size_t n) {
    std::vector<Item> items(n);
    for (size_t i = n; i-- > 0;) items[i] = pop();
    return items;
  };
  auto list_at_top = [&](std::vector<Item> items) {
    if (!top().value.isList() || top().callable != Callable::none) fail("APPEND to something that is not a list");
    grow_top(place_all(items));
    auto list = top().value.toList();
    for (auto& item : items) list.push_back(std::move(item.value));
  };
  // In a distributed checkpoint's metadata, a dict keyed by dataclasses
  // (storage_data's MetadataIndex), which no LibTorch dict can hash, is read
  // as its items: at each position the (key, value) tuple.
  auto dict_at_top = [&](std::vector<Item> items) {
    if (!top().value.isGenericDict() || items.size() % 2 != 0) fail("SETITEM on something that is not a dict");
    bool by_object = dialect_ == PickleDialect::distributed_checkpoint && !items.empty() &&
                     items[0].value.isGenericDict();
    for (size_t i = 0; i < items.size(); i += 2)
      if (!by_object || !items[i].value.isGenericDict()) check_key(items[i].value);
    grow_top(place_all(items) + (by_object ? 1 : 0));
    auto dict = top().value.toGenericDict();
    for (size_t i = 0; i < items.size(); i += 2) {
      if (by_object)
        dict.insert(static_cast<int64_t>(dict.size()), c10::ivalue::Tuple::create(items[i].value, items[i + 1].value));
      else
        dict.insert_or_assign(items[i].value, items[i + 1].value);
    }
  };
  switch (op) {
    case ')': tuple_of({}); break;                                              // EMPTY_TUPLE
    case 0x85: case 0x86: case 0x87: tuple_of(pop_items(op - 0x84)); break;     // TUPLE1..3
    case 't': tuple_of(pop_to_mark()); break;                                   // TUPLE
    case ']': case 0x8f: push(new_list()); break;                               // EMPTY_LIST, EMPTY_SET
    case 'l': case 0x91: {                                                      // LIST, FROZENSET
      auto items = pop_to_mark();
      size_t depth = place_all(items);
      auto list = new_list();
      for (auto& item : items) list.push_back(std::move(item.value));
      push_made(list, depth);
      break;
    }
    case 'a': list_at_top(pop_items(1)); break;                                 // APPEND
    case 'e': case 0x90: list_at_top(pop_to_mark()); break;                     // APPENDS, ADDITEMS
    case '}': push(new_dict()); break;                                          // EMPTY_DICT
    case 'd': { auto items = pop_to_mark(); push(new_dict()); dict_at_top(std::move(items)); break; }  // DICT
    case 's': dict_at_top(pop_items(2)); break;                                 // SETITEM
    case 'u': dict_at_top(pop_to_mark()); break;                                // SETITEMS
    default: return false;
  }
  return true;
}

// One opcode; false at STOP.
bool PickleReader::step(uint8_t op) {
  if (push_literal(op) || build_container(op)) return true;
  switch (op) {
    case 0x80: take(1); break;   // PROTO
    case 0x95: take(8); break;   // FRAME: framing changes nothing for a reader of the whole pickle
    case '.': return false;      // STOP
    case '(': marks_.push_back(stack_.size()); break;  // MARK
    case '0': pop(); break;                            // POP
    case '1': pop_to_mark(); break;                    // POP_MARK
    case '2': { Item copy = top(); stack_.push_back(std::move(copy)); break; }  // DUP
    case 'h': memo_get(little(1)); break;              // BINGET
    case 'j': memo_get(little(4)); break;              // LONG_BINGET
    case 'q': memo_put(little(1)); break;              // BINPUT
    case 'r': memo_put(little(4)); break;              // LONG_BINPUT
    case 0x94: memo_put(memo_.size()); break;          // MEMOIZE
    case 0x81:                                         // NEWOBJ
      if (dialect_ == PickleDialect::torch_save) fail("NEWOBJ, which torch.save does not write");
      new_object();
      break;
    case 'c': { std::string module = line(); push_global(module, line()); break; }  // GLOBAL
    case 0x93: {                                                                     // STACK_GLOBAL
      c10::IValue name = pop_value(), module = pop_value();
      if (!name.isString() || !module.isString()) fail("STACK_GLOBAL of something other than two strings");
      push_global(module.toStringRef(), name.toStringRef());
      break;
    }
    case 'R': reduce(); break;
    case 'b': {  // BUILD: the state of a dict (its _metadata) or a tensor is not kept; an object's is its dict
      if (dialect_ == PickleDialect::distributed_checkpoint) {
        build_object();
        break;
      }
      Item state = pop();
      if (top().value.isGenericDict()) {
        grow_top(place(state));
      } else if (!top().value.isTensor()) {
        fail("BUILD on something other than a dict or tensor");
      }
      break;
    }
    case 'Q': push(persistent_load_(pop_value())); break;  // BINPERSID
    default:
      fail(fmt::format("opcode 0x{:02x} ('{}') is not one fulgor reads; accepted: the opcodes of protocols 2 to 5 "
                       "that torch.save writes",
                       op, std::isprint(op) ? static_cast<char>(op) : '?'));
  }
  return true;
}

c10::IValue PickleReader::run() {
  while (true) {
    uint8_t op = *take(1);
    if (!step(op)) break;
  }
  if (stack_.size() != 1 || !marks_.empty()) fail("STOP with other than one value on the stack");
  return stack_.back().value;
}

}  // namespace

c10::IValue read_pickle(const uint8_t* data, size_t size, const PersistentLoad& persistent_load,
                        const std::string& source, PickleDialect dialect) {
  try {
    return PickleReader(data, size, persistent_load, source, dialect).run();
  } catch (const c10::Error& e) {
    throw InteropError(fmt::format("{}: malformed pickle: {}", source, e.what_without_backtrace()));
  }
}

c10::ScalarType storage_dtype(const std::string& storage_type, const std::string& source) {
  using S = c10::ScalarType;
  static const std::map<std::string, c10::ScalarType> table = {
      {"torch.FloatStorage", S::Float},   {"torch.DoubleStorage", S::Double}, {"torch.HalfStorage", S::Half},
      {"torch.BFloat16Storage", S::BFloat16}, {"torch.LongStorage", S::Long}, {"torch.IntStorage", S::Int},
      {"torch.ShortStorage", S::Short},   {"torch.CharStorage", S::Char},     {"torch.ByteStorage", S::Byte},
      {"torch.BoolStorage", S::Bool},     {"torch.ComplexFloatStorage", S::ComplexFloat},
      {"torch.ComplexDoubleStorage", S::ComplexDouble}, {"torch.UntypedStorage", S::Byte},
  };
  auto it = table.find(storage_type);
  if (it == table.end())
    throw InteropError(fmt::format("{}: storage type '{}' is not one fulgor reads (quantized storages are not)",
                                   source, storage_type));
  return it->second;
}

}  // namespace fulgor::detail
