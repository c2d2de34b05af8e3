#include "fulgor/interop/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include "detail/regular_file.h"
#include "fulgor/core/error.h"
#include "fulgor/detail/compat.h"
#include "interop/safetensors_reader.h"

namespace fulgor {
namespace detail {
namespace {

// The format's own reader refuses larger headers.
constexpr uint64_t kMaxHeader = 100'000'000;
// The most tensors a header may declare, counted before any is built: far
// more than a model's file holds (a large model's shard holds thousands).
constexpr size_t kMaxEntries = 1'000'000;

const std::vector<std::pair<std::string, c10::ScalarType>>& base_dtypes() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> table = {
      {"BOOL", c10::kBool}, {"U8", c10::kByte},  {"I8", c10::kChar},      {"I16", c10::kShort},
      {"I32", c10::kInt},   {"I64", c10::kLong}, {"F16", c10::kHalf},     {"BF16", c10::kBFloat16},
      {"F32", c10::kFloat}, {"F64", c10::kDouble}, {"C64", c10::kComplexFloat}};
  return table;
}
const char* const kNewerDtypes[] = {"U16", "U32", "U64", "F8_E4M3", "F8_E5M2"};

c10::ScalarType dtype_named(const std::string& name, const std::string& file, const std::string& tensor) {
  for (const auto& [n, dtype] : base_dtypes())
    if (n == name) return dtype;
  if (auto dtype = compat::newer_safetensors_dtype(name)) return *dtype;
  bool newer = std::find(std::begin(kNewerDtypes), std::end(kNewerDtypes), name) != std::end(kNewerDtypes);
  throw InteropError(fmt::format("'{}': tensor '{}' has dtype {}, which {}", file, tensor, name,
                                 newer ? "this LibTorch (" TORCH_VERSION ") does not have"
                                       : "is not a safetensors dtype fulgor knows"));
}

std::string name_of(c10::ScalarType dtype) {
  for (const auto& [name, d] : base_dtypes())
    if (d == dtype) return name;
  for (const char* name : kNewerDtypes)
    if (compat::newer_safetensors_dtype(name) == dtype) return name;
  throw InteropError(fmt::format("safetensors has no name for dtype {}", c10::toString(dtype)));
}

struct Entry {
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// Note [A header in linear time]
// A header is {name: {dtype, shape: [at most 64 ints], data_offsets: [2 ints]},
// __metadata__: {str: str}}. It is checked first in one SAX pass that builds
// nothing: nothing deeper or longer than that, at most kMaxEntries names, no
// name twice (found by sorting the names). Only then is it parsed into a json,
// whose memory is a small multiple of the header's size. nlohmann's parse with
// a callback, which made these checks before, scans the whole enclosing
// object each time a nested one ends (to drop what the callback discarded):
// a header of n tensors took time quadratic in n, 140 s for 100,000.
class HeaderCheck : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit HeaderCheck(const std::string& file) : file_(file) {}

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& name) override {
    if (depth_ != 1) return true;
    if (names_.size() == kMaxEntries)
      throw InteropError(fmt::format("'{}': the header declares more than {} tensors", file_, kMaxEntries));
    names_.push_back(std::move(name));
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw InteropError(fmt::format("'{}': the header is not valid JSON: {}", file_, e.what()));
  }

  // Throws InteropError naming a name that the header gives twice.
  void check_names() {
    std::sort(names_.begin(), names_.end());
    const auto twice = std::adjacent_find(names_.begin(), names_.end());
    if (twice != names_.end()) throw InteropError(fmt::format("'{}': the header names '{}' twice", file_, *twice));
  }

 private:
  bool open() {
    if (depth_ == 3)
      throw InteropError(fmt::format("'{}': the header nests deeper than a safetensors header does", file_));
    ++depth_;
    in_array_ = 0;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  // A value inside an array (or an object) of a tensor's entry: a shape has at most 64.
  bool value() {
    if (depth_ == 3 && ++in_array_ > 64)
      throw InteropError(
          fmt::format("'{}': an array of the header has more than 64 entries; shapes have at most 64", file_));
    return true;
  }

  const std::string& file_;
  int depth_ = 0;
  size_t in_array_ = 0;
  std::vector<std::string> names_;
};

nlohmann::json parse_header(const MappedFile& file, uint64_t length) {
  const char* begin = reinterpret_cast<const char*>(file.data() + 8);
  HeaderCheck check(file.name());
  nlohmann::json::sax_parse(begin, begin + length, &check);
  check.check_names();
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(begin, begin + length);
  } catch (const nlohmann::json::exception& e) {
    throw InteropError(fmt::format("'{}': the header is not valid JSON: {}", file.name(), e.what()));
  }
  if (!header.is_object()) throw InteropError(fmt::format("'{}': the header is not a JSON object", file.name()));
  return header;
}

Entry entry_of(const std::string& file, const std::string& name, const nlohmann::json& info) {
  auto bad = [&](const char* what) {
    return InteropError(fmt::format("'{}': tensor '{}' {}", file, name, what));
  };
  if (!info.is_object() || !info.contains("dtype") || !info["dtype"].is_string() || !info.contains("shape") ||
      !info["shape"].is_array() || !info.contains("data_offsets") || !info["data_offsets"].is_array() ||
      info["data_offsets"].size() != 2)
    throw bad("is not {\"dtype\": string, \"shape\": [ints], \"data_offsets\": [begin, end]}");
  Entry entry{name, dtype_named(info["dtype"].get<std::string>(), file, name), {}, 0, 0};
  for (const auto& d : info["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) throw bad("has a shape that is not of non-negative ints");
    entry.shape.push_back(d.get<int64_t>());
  }
  for (const auto& o : info["data_offsets"])
    if (!o.is_number_unsigned()) throw bad("has data offsets that are not non-negative ints");
  entry.begin = info["data_offsets"][0].get<uint64_t>();
  entry.end = info["data_offsets"][1].get<uint64_t>();
  uint64_t bytes = c10::elementSize(entry.dtype);
  for (int64_t d : entry.shape)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) throw bad("has a shape too large to hold");
  if (entry.end < entry.begin || entry.end - entry.begin != bytes)
    throw InteropError(fmt::format("'{}': tensor '{}' of {} [{}] needs {} bytes; its data offsets [{}, {}] hold {}",
                                   file, name, info["dtype"].get<std::string>(), fmt::join(entry.shape, ", "), bytes,
                                   entry.begin, entry.end, static_cast<int64_t>(entry.end - entry.begin)));
  return entry;
}

torch::Tensor tensor_over(const std::shared_ptr<MappedFile>& file, uint8_t* data, const Entry& entry) {
  auto options = torch::TensorOptions().dtype(entry.dtype);
  size_t bytes = entry.end - entry.begin;
  if (reinterpret_cast<uintptr_t>(data) % c10::elementSize(entry.dtype) != 0 || bytes == 0) {
    torch::Tensor copy = torch::empty(entry.shape, options);
    if (bytes != 0) std::memcpy(copy.data_ptr(), data, bytes);
    return copy;
  }
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, aliasing_data_ptr(file, data), nullptr, false);
  std::vector<int64_t> strides(entry.shape.size(), 1);
  for (size_t i = strides.size(); i-- > 1;) strides[i - 1] = strides[i] * entry.shape[i];
  return torch::empty({0}, options).set_(storage, 0, entry.shape, strides);
}

}  // namespace

Safetensors read_safetensors_file(const std::shared_ptr<MappedFile>& file) {
  const std::string& name = file->name();
  if (file->size() < 8) throw InteropError(fmt::format("'{}' is too short for a safetensors header", name));
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | file->data()[i];
  if (length > kMaxHeader)
    throw InteropError(fmt::format("'{}': a header of {} bytes, over safetensors' limit of {}", name, length, kMaxHeader));
  if (length > file->size() - 8)
    throw InteropError(fmt::format("'{}' is truncated: its header needs {} bytes, {} follow", name, length, file->size() - 8));
  nlohmann::json header = parse_header(*file, length);
  Safetensors out;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key != "__metadata__") {
      entries.push_back(entry_of(name, key, value));
      continue;
    }
    if (!value.is_object()) throw InteropError(fmt::format("'{}': __metadata__ is not a map of strings", name));
    for (const auto& [k, v] : value.items()) {
      if (!v.is_string()) throw InteropError(fmt::format("'{}': __metadata__ '{}' is not a string", name, k));
      out.metadata[k] = v.get<std::string>();
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t data_size = file->size() - 8 - length, at = 0;
  for (const Entry& e : entries) {
    if (e.begin != at)
      throw InteropError(fmt::format("'{}': tensor '{}' starts at {}, not at {} where the one before ends: the data "
                                     "must be contiguous and not overlap",
                                     name, e.name, e.begin, at));
    at = e.end;
  }
  if (at != data_size)
    throw InteropError(fmt::format("'{}': the tensors end at {}, the data is {} bytes long{}", name, at, data_size,
                                   at > data_size ? " (truncated)" : ""));
  uint8_t* data = file->data() + 8 + length;
  for (const Entry& e : entries) out.tensors.insert(e.name, tensor_over(file, data + e.begin, e));
  return out;
}

}  // namespace detail

Safetensors read_safetensors(const std::filesystem::path& path) {
  return detail::read_safetensors_file(detail::MappedFile::open(path));
}

void write_safetensors(const StateDict& tensors, const std::filesystem::path& path,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  uint64_t at = 0;
  for (const auto& entry : tensors) {
    if (entry.key() == "__metadata__") throw InteropError("safetensors reserves the name '__metadata__' for metadata");
    // A view that repeats its storage's elements (a stride of 0) would be
    // written out element by element: 2^62 of them from a file of bytes.
    const torch::Tensor& view = entry.value();
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(view.numel()), view.element_size(), &bytes) ||
        (view.has_storage() && bytes > view.storage().nbytes()))
      throw InteropError(fmt::format("cannot write '{}': tensor '{}' is a view of {} elements ({}) and its storage "
                                     "holds {}: safetensors stores each element; write view.contiguous() or "
                                     "view.clone() if the copy is meant",
                                     path.string(), entry.key(), view.numel(), fmt::join(view.sizes(), "x"),
                                     view.has_storage() ? view.storage().nbytes() / view.element_size() : 0));
    torch::Tensor t = view.detach().cpu().contiguous();
    header[entry.key()] = {{"dtype", detail::name_of(t.scalar_type())},
                           {"shape", t.sizes().vec()},
                           {"data_offsets", {at, at + t.nbytes()}}};
    at += t.nbytes();
    data.push_back(t);
  }
  detail::check_output<InteropError>(path.string());
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::filesystem::path temporary = path;
  temporary += fmt::format(".tmp{}", getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    out.write(length, 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : data) out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    if (!out.flush()) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw InteropError(fmt::format("cannot write '{}'", path.string()));
    }
  }
  std::error_code renamed;
  std::filesystem::rename(temporary, path, renamed);
  if (renamed) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw InteropError(fmt::format("cannot write '{}': {}", path.string(), renamed.message()));
  }
}

}  // namespace fulgor
