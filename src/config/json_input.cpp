#include "config/json_input.h"

#include <fmt/format.h>

#include <vector>

namespace fulgor::detail {
namespace {

using nlohmann::json;

// Cuts `text` to about `limit` bytes, at a character boundary.
std::string shorten(std::string text, size_t limit) {
  if (text.size() <= limit) return text;
  size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "...";
}

// Builds the value as nlohmann's own reader does, refusing what Note
// [Reading outside JSON] says. Returning false stops the parse.
class Builder {
 public:
  bool null() { return put(nullptr); }
  bool boolean(bool value) { return put(value); }
  bool number_integer(json::number_integer_t value) { return put(value); }
  bool number_unsigned(json::number_unsigned_t value) { return put(value); }
  bool number_float(json::number_float_t value, const json::string_t& text) {
    // nlohmann reads an integer that fits no 64-bit type as a floating-point number.
    if (text.find_first_of(".eE") == std::string::npos)
      return refuse(fmt::format("{}the integer {} is out of range (JSON integers must fit in 64 bits)", where(),
                                shorten(text, 60)));
    return put(value);
  }
  bool string(json::string_t& value) { return put(std::move(value)); }
  bool binary(json::binary_t& value) { return put(std::move(value)); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool key(json::string_t& key) {
    keys_.back() = key;
    // nlohmann keeps the last of repeated keys; a config with two values for
    // one option is a mistake to name, not a choice to make silently.
    if (stack_.back()->contains(key))
      return refuse(fmt::format("{}the key {} appears twice in one object; each key may be given once", where(),
                                json_for_message(key)));
    slot_ = &(*stack_.back())[key];
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    // What nlohmann says, without its "[json.exception.parse_error.101] " tag.
    std::string message = e.what();
    if (auto tag = message.find("] "); message.rfind("[json.exception.", 0) == 0 && tag != std::string::npos)
      message = message.substr(tag + 2);
    error_ = shorten(message, 300);
    not_json_ = true;
    return false;
  }

  JsonInput result() && {
    JsonInput input;
    if (error_.empty()) input.value = std::move(root_);
    input.error = std::move(error_);
    input.not_json = not_json_;
    return input;
  }

 private:
  json* put(json&& value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(value));
      return &stack_.back()->back();
    }
    *slot_ = std::move(value);
    return slot_;
  }
  bool open(json&& container) {
    if (stack_.size() >= kMaxJsonDepth)
      return refuse(fmt::format("arrays and objects nested deeper than {} levels", kMaxJsonDepth));
    stack_.push_back(put(std::move(container)));
    keys_.emplace_back();
    return true;
  }
  bool close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool refuse(std::string why) {
    error_ = std::move(why);
    return false;
  }
  // Where the value being read goes, as "trainer.max_epochs: " or "devices[2]: ".
  std::string where() const {
    std::string path;
    for (size_t i = 0; i < stack_.size(); ++i) {
      if (stack_[i]->is_array()) {
        // The innermost array's next element, or the element that holds the next level.
        const size_t size = stack_[i]->size();
        path += fmt::format("[{}]", i + 1 == stack_.size() ? size : size - 1);
      } else {
        path += (path.empty() ? "" : ".") + keys_[i];
      }
    }
    return path.empty() ? "" : shorten(path, 200) + ": ";
  }

  json root_;
  // The open arrays and objects, outermost first, with their current keys.
  std::vector<json*> stack_;
  std::vector<std::string> keys_;
  json* slot_ = nullptr;  // where the current key's value goes
  std::string error_;
  bool not_json_ = false;
};

}  // namespace

JsonInput read_json(std::string_view text, bool comments) {
  Builder builder;
  json::sax_parse(text.data(), text.data() + text.size(), &builder, json::input_format_t::json, /*strict=*/true,
                  comments);
  return std::move(builder).result();
}

std::string json_for_message(const json& value) {
  return shorten(value.dump(-1, ' ', false, json::error_handler_t::replace), 100);
}

bool is_valid_utf8(const std::string& text) {
  // The rule nlohmann applies when it writes a string.
  try {
    (void)json(text).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

}  // namespace fulgor::detail
