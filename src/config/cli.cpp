#include "fulgor/config/cli.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <sstream>

#include "config/closest_name.h"
#include "config/json_input.h"
#include "detail/read_at.h"
#include "detail/regular_file.h"
#include "fulgor/core/error.h"

namespace fulgor {
namespace {

using nlohmann::json;

// A config file is a few kilobytes; a larger file is no config.
constexpr uint64_t kMaxConfigBytes = 16 << 20;

std::string read_config_text(const std::string& path) {
  // Note [Opening a user's path]: a FIFO is refused, not waited on.
  const detail::RegularFile file = detail::RegularFile::open(path);
  if (!file) throw ConfigError(fmt::format("--config {}: {}", path, file.problem()));
  if (file.size() > kMaxConfigBytes)
    throw ConfigError(fmt::format("--config {}: larger than {} MiB, not a config file", path, kMaxConfigBytes >> 20));
  std::string text(static_cast<size_t>(file.size()), '\0');
  if (!detail::read_at(file.fd(), 0, text.data(), text.size()))
    throw ConfigError(
        fmt::format("--config {}: cannot read the file: {}", path, errno != 0 ? std::strerror(errno) : "it shrank"));
  return text;
}

json read_config(const std::string& path) {
  detail::JsonInput config = detail::read_json(read_config_text(path), /*comments=*/true);
  if (config.not_json) throw ConfigError(fmt::format("--config {}: not valid JSON: {}", path, config.error));
  if (!config.error.empty()) throw ConfigError(fmt::format("--config {}: {}", path, config.error));
  if (!config.value.is_object())
    throw ConfigError(fmt::format("--config {}: expected a JSON object of sections (\"trainer\", ...)", path));
  return std::move(config.value);
}

std::vector<std::string> keys_of(const json& object) {
  std::vector<std::string> keys;
  for (const auto& item : object.items()) keys.push_back(item.key());
  return keys;
}

// The program's declared sections (null: none declared, every section kept as given).
void check_declared(const json& declared) {
  if (declared.is_null()) return;
  bool objects = declared.is_object();
  for (const auto& section : declared.items()) objects = objects && section.value().is_object();
  if (!objects || declared.contains("trainer"))
    throw ConfigError(fmt::format(
        "the program's sections must be a JSON object of sections other than \"trainer\", each an object of "
        "keys and their defaults, not {}",
        detail::json_for_message(declared)));
}

// Throws (`where` first) unless the declared sections, if any, have `section`
// (and `key`, when not empty).
void check_known(const json& declared, const std::string& section, const std::string& key, const std::string& where) {
  if (declared.is_null()) return;
  if (!declared.contains(section)) {
    std::vector<std::string> known = keys_of(declared);
    known.insert(known.begin(), "trainer");
    throw ConfigError(fmt::format("{}: {}", where, detail::unknown_name_message("section", section, known)));
  }
  if (!key.empty() && !declared[section].contains(key))
    throw ConfigError(fmt::format("{}: {}", where,
                                  detail::unknown_name_message(section + " option", key, keys_of(declared[section]))));
}

void apply_config(CommandLine& result, const json& config, const std::string& path, const json& declared) {
  for (const auto& section : config.items()) {
    if (section.key() != "trainer" && !declared.is_null()) {
      const std::string where = fmt::format("--config {}", path);
      check_known(declared, section.key(), "", where);
      if (!section.value().is_object())
        throw ConfigError(fmt::format("{}: section \"{}\" must be an object of its keys, not {}", where,
                                      section.key(), detail::json_for_message(section.value())));
      for (const auto& item : section.value().items()) check_known(declared, section.key(), item.key(), where);
    }
    if (section.key() == "trainer") {
      try {
        from_json(section.value(), result.trainer);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("--config {}: {}", path, e.what()));
      }
    } else if (auto& held = result.sections[section.key()]; section.value().is_object() && held.is_object()) {
      held.update(section.value());
    } else {
      held = section.value();
    }
  }
}

// A value given as --<section>.<key>=<text>: the JSON it is, or else the text as a string.
json section_value(const std::string& name, const std::string& text) {
  detail::JsonInput parsed = detail::read_json(text);
  if (parsed.not_json) return text;
  if (!parsed.error.empty()) throw ConfigError(fmt::format("--{}: {}", name, parsed.error));
  return std::move(parsed.value);
}

}  // namespace

CommandLine parse_command_line(int argc, const char* const* argv, TrainerOptions defaults, const json& sections) {
  check_declared(sections);
  CommandLine result;
  result.trainer = std::move(defaults);
  if (!sections.is_null()) result.sections = sections;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      result.help_requested = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0)
      throw ConfigError(
          fmt::format("unexpected argument '{}': expected --config FILE or --<section>.<key>=<value>", arg));
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    } else if (i + 1 < argc) {
      value = argv[++i];
      has_value = true;
    }
    if (!has_value) throw ConfigError(fmt::format("argument '{}' needs a value", arg));
    if (name == "config") {
      // A path is bytes to the system, UTF-8 or not.
      apply_config(result, read_config(value), value, sections);
      continue;
    }
    // Options become JSON strings, which must be UTF-8.
    if (!detail::is_valid_utf8(name))
      throw ConfigError(fmt::format("argument {}: the option name is not valid UTF-8", detail::json_for_message(name)));
    if (!detail::is_valid_utf8(value))
      throw ConfigError(fmt::format("--{}: the value {} is not valid UTF-8", name, detail::json_for_message(value)));
    auto dot = name.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == name.size())
      throw ConfigError(
          fmt::format("unexpected argument '{}': expected --config FILE or --<section>.<key>=<value>", arg));
    std::string section = name.substr(0, dot), key = name.substr(dot + 1);
    if (section == "trainer") {
      try {
        set_option(result.trainer, key, value);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("--{}: {}", name, e.what()));
      }
    } else {
      check_known(sections, section, key, "--" + name);
      // A section a config file gave as a single value is replaced by one of keys, as later arguments win.
      json& held = result.sections[section];
      if (!held.is_object()) held = json::object();
      held[key] = section_value(name, value);
    }
  }
  return result;
}

namespace impl {
void throw_unreadable_section_value(const std::string& section, const std::string& key, const json& value,
                                    const std::string& why) {
  // nlohmann's words without its "[json.exception.type_error.302] " tag.
  std::string reason = why;
  if (auto tag = reason.find("] "); reason.rfind("[json.exception.", 0) == 0 && tag != std::string::npos)
    reason = reason.substr(tag + 2);
  throw ConfigError(fmt::format("--{}.{}: cannot read {}: {}", section, key, detail::json_for_message(value), reason));
}
}  // namespace impl

std::string command_line_help(const std::string& program, const TrainerOptions& defaults, const json& sections) {
  check_declared(sections);
  std::ostringstream out;
  out << "usage: " << program
      << " [--config FILE.json] [--trainer.<option>=<value> ...] [--<section>.<key>=<value> ...]\n\n"
      << "Trainer options (default in brackets):\n";
  json values = defaults;
  for (const auto& name : trainer_option_names())
    out << fmt::format("  --trainer.{:<26} [{}]\n", name,
                       values[name].dump(-1, ' ', false, json::error_handler_t::replace));
  if (sections.is_null()) return out.str();
  for (const auto& section : sections.items()) {
    out << fmt::format("\nThe {} section:\n", section.key());
    for (const auto& item : section.value().items())
      out << fmt::format("  --{:<34} [{}]\n", section.key() + "." + item.key(),
                         item.value().dump(-1, ' ', false, json::error_handler_t::replace));
  }
  return out.str();
}

}  // namespace fulgor
