#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "fulgor/config/trainer_options.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// A command line parsed in the style of Lightning's LightningCLI:
///
///   prog --config run.json --trainer.max_epochs=3 --trainer.accelerator xpu --model.hidden=64
///
/// `--config FILE` (or `--config=FILE`) reads a JSON object whose sections
/// ("trainer", "model", ...) hold options; later arguments override earlier ones
/// and config files. `--<section>.<key>=<value>` sets one option: trainer keys
/// are checked against TrainerOptions at once; other sections are kept as JSON
/// for the program (a value that parses as JSON is stored as such, otherwise as
/// a string). A program may declare its own sections and their keys (see
/// parse_command_line); then a section or a key it did not declare is refused
/// too. `--help` sets help_requested; the library never exits.
///
/// Ensures: throws ConfigError naming the argument for an unknown trainer key
/// or declared section's key (and the known name nearest to it by edit
/// distance, "did you mean 'accelerator'?", when one is that near),
/// an ill-typed value (naming the expected type), a missing value, an unreadable
/// or malformed config file (a folder, not JSON, nested deeper than 256 levels,
/// an integer beyond 64 bits), an option or value that is not UTF-8, or an
/// argument of another shape. A section given a single value by a config file
/// is replaced by `--<section>.<key>`, as later arguments win.
struct CommandLine {
  TrainerOptions trainer;
  /// Every section other than "trainer", e.g. sections["model"]["hidden"].
  nlohmann::json sections = nlohmann::json::object();
  bool help_requested = false;

  /// A section's value, or `fallback` when the key was not given. Throws
  /// ConfigError naming `--<section>.<key>` and the value when it is not a
  /// T: an integer type takes only integers within its range.
  template <typename T>
  T get(const std::string& section, const std::string& key, T fallback) const;
};

namespace impl {
[[noreturn]] FULGOR_API void throw_unreadable_section_value(const std::string& section, const std::string& key,
                                                            const nlohmann::json& value, const std::string& why);
}  // namespace impl

template <typename T>
T CommandLine::get(const std::string& section, const std::string& key, T fallback) const {
  auto s = sections.find(section);
  if (s == sections.end() || !s->contains(key)) return fallback;
  const nlohmann::json& value = s->at(key);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // nlohmann would truncate 2.5 and wrap 2^40 into an int.
    using limits = std::numeric_limits<T>;
    bool fits = false;
    if (value.is_number_unsigned()) {
      fits = value.template get<uint64_t>() <= static_cast<uint64_t>(limits::max());
    } else if (value.is_number_integer()) {
      const auto v = value.template get<int64_t>();
      fits = v >= static_cast<int64_t>(limits::min()) &&
             (v < 0 || static_cast<uint64_t>(v) <= static_cast<uint64_t>(limits::max()));
    }
    if (!fits)
      impl::throw_unreadable_section_value(
          section, key, value,
          "expected an integer from " + std::to_string(limits::min()) + " to " + std::to_string(limits::max()));
    return value.template get<T>();
  } else {
    try {
      return value.template get<T>();
    } catch (const nlohmann::json::exception& e) {
      impl::throw_unreadable_section_value(section, key, value, e.what());
    }
  }
}

/// Parses `argv[1..argc)` onto `defaults` (the program's own trainer defaults).
/// `sections`, when not null, declares the program's own sections, each an
/// object of its keys and their defaults:
///
///   {{"model", {{"arch", "cnn"}, {"lr", 1e-3}}}, {"data", {{"batch_size", 128}}}}
///
/// The defaults start CommandLine::sections, and a section or a key that is not
/// declared, on the command line or in a config file, is a ConfigError naming
/// the nearest declared one; a declared section must be given an object of
/// keys. Null (the default) keeps every other section as given, unchecked.
FULGOR_API CommandLine parse_command_line(int argc, const char* const* argv, TrainerOptions defaults = {},
                                          const nlohmann::json& sections = nullptr);

/// A usage text listing every trainer option with its default, and the
/// program's declared sections' keys with theirs.
FULGOR_API std::string command_line_help(const std::string& program, const TrainerOptions& defaults = {},
                                          const nlohmann::json& sections = nullptr);

}  // namespace fulgor
