#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "fulgor/trainer_options.h"

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
/// a string). `--help` sets help_requested; the library never exits.
///
/// Ensures: throws ConfigError naming the argument for an unknown trainer key,
/// an ill-typed value (naming the expected type), a missing value, an unreadable
/// or malformed config file, or an argument of another shape.
struct CommandLine {
  TrainerOptions trainer;
  /// Every section other than "trainer", e.g. sections["model"]["hidden"].
  nlohmann::json sections = nlohmann::json::object();
  bool help_requested = false;

  /// A section's value, or `fallback` when the key was not given.
  template <typename T>
  T get(const std::string& section, const std::string& key, T fallback) const {
    auto s = sections.find(section);
    if (s == sections.end() || !s->contains(key)) return fallback;
    return s->at(key).get<T>();
  }
};

/// Parses `argv[1..argc)` onto `defaults` (the program's own trainer defaults).
CommandLine parse_command_line(int argc, const char* const* argv, TrainerOptions defaults = {});

/// A usage text listing every trainer option with its default.
std::string command_line_help(const std::string& program, const TrainerOptions& defaults = {});

}  // namespace fulgor
