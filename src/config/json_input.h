#pragma once

// JSON that comes from outside the program: config files, option values typed
// on a command line, checkpoint metadata.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace fulgor::detail {

// Note [Reading outside JSON]
// nlohmann's reader takes input fulgor must not: integers of 2^64 and more
// become floating-point numbers that an integer option would take as some
// other value, and arrays and objects nest as deep as the input goes, while
// copying, printing and destroying a value recurse once per level, so a
// config file nested 100,000 deep overflows the stack; and a key repeated in
// one object silently keeps its last value, so a config file that sets an
// option twice runs with whichever came last. Every JSON read from outside
// the program goes through read_json, which refuses all three, naming where
// in the document (`trainer.max_epochs`) and the number or key as written.

/// How deeply arrays and objects may nest in JSON read from outside: far more
/// than any config or checkpoint needs, far less than overflows a stack.
inline constexpr size_t kMaxJsonDepth = 256;

/// The value of a JSON text, or why there is none.
struct JsonInput {
  nlohmann::json value;
  /// Empty when `value` was read; otherwise why not, in words.
  std::string error;
  /// With an error: the text is no JSON at all (rather than JSON refused for
  /// its depth or a number out of range).
  bool not_json = false;
};

/// Reads `text` as one JSON value (with `comments`, `//` and `/* */` comments
/// are skipped). Refuses nesting deeper than kMaxJsonDepth, integers outside
/// 64 bits and a key repeated in one object; throws nothing.
JsonInput read_json(std::string_view text, bool comments = false);

/// `value` as JSON text for an error message: invalid UTF-8 replaced, cut to
/// about 100 characters.
std::string json_for_message(const nlohmann::json& value);

/// Whether `text` is valid UTF-8, as a JSON string must be.
bool is_valid_utf8(const std::string& text);

}  // namespace fulgor::detail
