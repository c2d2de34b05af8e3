#include "archive/script_archive.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <vector>

#include "archive/torch_archive.h"
#include "fulgor/core/error.h"

namespace fulgor::detail {
namespace {

// The most a code record or a pickle of source ranges may hold once inflated:
// each declares one class's attributes.
constexpr size_t kMaxSideRecord = size_t{16} << 20;

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A left-to-right reader of one line of a class's source.
class Cursor {
 public:
  explicit Cursor(std::string_view text) : text_(text) {}
  bool done() const { return at_ == text_.size(); }
  bool literal(std::string_view s) {
    if (text_.substr(at_, s.size()) != s) return false;
    at_ += s.size();
    return true;
  }
  // A double-quoted string as LibTorch prints one, escapes included.
  bool quoted() {
    if (!literal("\"")) return false;
    for (; at_ < text_.size(); ++at_) {
      if (text_[at_] == '\\') {
        ++at_;
      } else if (text_[at_] == '"') {
        ++at_;
        return true;
      }
    }
    return false;
  }
  bool identifier() {
    size_t start = at_;
    while (at_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_')) ++at_;
    return at_ > start && !std::isdigit(static_cast<unsigned char>(text_[start]));
  }
  // A type, up to the end of the line.
  bool type_to_end() { return is_data_type(text_.substr(at_)) && (at_ = text_.size(), true); }

 private:
  std::string_view text_;
  size_t at_ = 0;
};

// `  __parameters__ = ["a", "b", ]`: names as LibTorch lists them.
bool name_list(Cursor& line) {
  if (!line.literal("[")) return false;
  while (!line.literal("]"))
    if (!line.quoted() || !line.literal(", ")) return false;
  return line.done();
}

// One line of a class body that declares and does nothing else.
bool is_declaration(std::string_view text) {
  Cursor line(text);
  if (!line.literal("  ")) return false;
  if (line.literal("__parameters__ = ") || line.literal("__buffers__ = ")) return name_list(line);
  if (line.literal("__annotations__")) {
    if (line.literal(" = []")) return line.done();
    return line.literal("[") && line.quoted() && line.literal("] = ") && line.type_to_end();
  }
  return line.identifier() && line.literal(" : ") && line.type_to_end();
}

// The code record of one module class: its header and declarations only.
void check_code(const ZipReader& zip, const std::string& record) {
  const std::string text = zip.read_copy(record, kMaxSideRecord);
  std::string_view code(text);
  size_t number = 0;
  for (size_t at = 0; at < code.size(); ++number) {
    size_t end = std::min(code.find('\n', at), code.size());
    std::string_view line = code.substr(at, end - at);
    at = end + 1;
    bool fine = number == 0 ? line == "class Module(Module):" : is_declaration(line);
    if (!fine)
      throw InteropError(fmt::format(
          "'{}': record '{}', line {}: '{}' is code, which fulgor refuses to load from a file: a fulgor checkpoint's "
          "classes only declare their attributes (`class Module(Module):`, `name : Type`)",
          zip.file()->name(), record, number + 1, line.substr(0, 120)));
  }
  if (number == 0) throw InteropError(fmt::format("'{}': record '{}' is empty", zip.file()->name(), record));
}

// The name of a record within the archive's folder, if it is one
// OutputArchive writes; "code" for a class's source.
const char* record_kind(std::string_view name) {
  static const std::set<std::string_view> fixed = {"data.pkl", "constants.pkl", "version", "byteorder",
                                                   ".data/version", ".data/serialization_id"};
  if (fixed.count(name) != 0) return "fixed";
  if (starts_with(name, "data/") && all_digits(name.substr(5))) return "data";
  std::string_view code = name;
  bool debug = ends_with(code, ".debug_pkl");
  if (debug) code.remove_suffix(10);
  if (code == "code/__torch__.py") return debug ? "debug" : "code";
  constexpr std::string_view mangled = "code/__torch__/___torch_mangle_";
  if (starts_with(code, mangled) && ends_with(code, ".py") &&
      all_digits(code.substr(mangled.size(), code.size() - mangled.size() - 3)))
    return debug ? "debug" : "code";
  return nullptr;
}

}  // namespace

bool is_archive_module_class(std::string_view qualified) {
  if (qualified == "__torch__.Module") return true;
  constexpr std::string_view mangled = "__torch__.___torch_mangle_";
  constexpr std::string_view tail = ".Module";
  return starts_with(qualified, mangled) && ends_with(qualified, tail) &&
         all_digits(qualified.substr(mangled.size(), qualified.size() - mangled.size() - tail.size()));
}

bool is_data_type(std::string_view type) {
  static const std::set<std::string_view> plain = {"Tensor", "str", "int", "float", "bool", "complex",
                                                   "NoneType", "Device", "Any", "()"};
  static const std::set<std::string_view> generic = {"Optional", "List", "Dict", "Tuple"};
  // Iterative, so that no type nests deeper than the reader's stack.
  size_t depth = 0;
  size_t at = 0;
  while (true) {
    size_t end = type.find_first_of("[], ", at);
    std::string_view name = type.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    at = end;
    bool opens = at != std::string_view::npos && type[at] == '[';
    if (opens ? generic.count(name) == 0 : plain.count(name) == 0 && !is_archive_module_class(name)) return false;
    if (opens) {
      if (++depth > 32) return false;
      ++at;
      continue;
    }
    // After a name: "]" closes, ", " goes on, the end ends.
    while (at != std::string_view::npos && at < type.size() && type[at] == ']') {
      if (depth-- == 0) return false;
      ++at;
    }
    if (at == std::string_view::npos || at == type.size()) return depth == 0;
    if (type.substr(at, 2) != ", " || depth == 0) return false;
    at += 2;
  }
}

void check_script_archive(const std::shared_ptr<MappedFile>& archive) {
  ZipReader zip(archive, /*deflated=*/true);
  const std::string& file = archive->name();
  if (zip.records().empty()) throw InteropError(fmt::format("'{}': the archive holds no records", file));
  const std::string& first = zip.records().begin()->first;
  const std::string folder = first.substr(0, first.find('/') + 1);
  std::vector<std::string> code, debug;
  for (const auto& [name, record] : zip.records()) {
    const char* kind = folder.empty() || !starts_with(name, folder) ? nullptr : record_kind(name.substr(folder.size()));
    if (kind == nullptr)
      throw InteropError(fmt::format("'{}': the archive holds record '{}', which fulgor refuses to load: a fulgor "
                                     "checkpoint holds data.pkl, constants.pkl, version, byteorder, tensor data "
                                     "(data/N) and the declarations of its module classes (code/), in one folder",
                                     file, name));
    if (std::string_view(kind) == "code") code.push_back(name);
    if (std::string_view(kind) == "debug") debug.push_back(name);
  }
  for (const std::string& name : code) check_code(zip, name);
  // The pickles LibTorch reads: the data, its constants and the source
  // ranges of the code; only the data has storages.
  if (!zip.has(folder + "data.pkl")) throw InteropError(fmt::format("'{}': the archive has no data.pkl", file));
  read_archive_pickle(zip, folder, "data.pkl", {}, PickleDialect::libtorch);
  auto no_storages = [&](const c10::IValue&) -> c10::IValue {
    throw InteropError(fmt::format("'{}': a tensor where the archive holds none (constants or source ranges)", file));
  };
  std::vector<std::string> others = debug;
  if (zip.has(folder + "constants.pkl")) others.push_back(folder + "constants.pkl");
  for (const std::string& name : others) {
    const std::string pickle = zip.read_copy(name, kMaxSideRecord);
    read_pickle(reinterpret_cast<const uint8_t*>(pickle.data()), pickle.size(), no_storages,
                fmt::format("'{}', record '{}'", file, name), PickleDialect::libtorch);
  }
}

}  // namespace fulgor::detail
