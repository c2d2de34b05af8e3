#include "fulgor/cli.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "fulgor/error.h"

namespace fulgor {
namespace {

using nlohmann::json;

json read_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("--config {}: cannot open the file", path));
  json config = json::parse(in, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (config.is_discarded()) throw ConfigError(fmt::format("--config {}: not valid JSON", path));
  if (!config.is_object())
    throw ConfigError(fmt::format("--config {}: expected a JSON object of sections (\"trainer\", ...)", path));
  return config;
}

void apply_config(CommandLine& result, const json& config, const std::string& path) {
  for (const auto& section : config.items()) {
    if (section.key() == "trainer") {
      try {
        from_json(section.value(), result.trainer);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("--config {}: {}", path, e.what()));
      }
    } else if (section.value().is_object()) {
      result.sections[section.key()].update(section.value());
    } else {
      result.sections[section.key()] = section.value();
    }
  }
}

}  // namespace

CommandLine parse_command_line(int argc, const char* const* argv, TrainerOptions defaults) {
  CommandLine result;
  result.trainer = std::move(defaults);
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
      apply_config(result, read_config(value), value);
      continue;
    }
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
      json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
      result.sections[section][key] = parsed.is_discarded() ? json(value) : parsed;
    }
  }
  return result;
}

std::string command_line_help(const std::string& program, const TrainerOptions& defaults) {
  std::ostringstream out;
  out << "usage: " << program
      << " [--config FILE.json] [--trainer.<option>=<value> ...] [--<section>.<key>=<value> ...]\n\n"
      << "Trainer options (default in brackets):\n";
  json values = defaults;
  for (const auto& name : trainer_option_names())
    out << fmt::format("  --trainer.{:<26} [{}]\n", name, values[name].dump());
  return out.str();
}

}  // namespace fulgor
