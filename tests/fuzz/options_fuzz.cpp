// A config file and a command line, read as a program using fulgor's
// LightningCLI-style parser reads them.
//
// The input up to its first NUL byte is a config file; after it come the
// arguments, separated by NUL bytes, where "@config" stands for the config
// file's path. An input without a NUL byte is a config file alone, given as
// `--config FILE`.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fulgor/config/cli.h"
#include "fulgor/core/error.h"
#include "fuzz.h"
#include "config/json_input.h"

namespace fulgor::fuzz {
namespace {

using nlohmann::json;

// The config file, rewritten for each input and removed at exit.
struct ConfigFile {
  std::string path =
      (std::filesystem::temp_directory_path() / ("fulgor_fuzz_options_" + std::to_string(::getpid()) + ".json"))
          .string();
  ~ConfigFile() { std::remove(path.c_str()); }
};

const std::string& config_path() {
  static const ConfigFile file;
  return file.path;
}

// What a program does with the sections: reads keys as the types it expects.
void read_sections(const CommandLine& cli) {
  for (const auto& section : cli.sections.items()) {
    if (!section.value().is_object()) continue;
    for (const auto& item : section.value().items()) {
      const std::string& s = section.key();
      const std::string& k = item.key();
      try {
        cli.get<int>(s, k, 0);
      } catch (const Error&) {
      }
      try {
        cli.get<uint64_t>(s, k, 0);
      } catch (const Error&) {
      }
      try {
        cli.get<double>(s, k, 0.0);
      } catch (const Error&) {
      }
      try {
        cli.get<bool>(s, k, false);
      } catch (const Error&) {
      }
      try {
        cli.get<std::string>(s, k, "");
      } catch (const Error&) {
      }
    }
  }
}

}  // namespace

void options(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  std::ofstream(config_path(), std::ios::binary | std::ios::trunc) << input.substr(0, nul);
  std::vector<std::string> args = {"fuzz"};
  if (nul == std::string::npos) {
    args.insert(args.end(), {"--config", "@config"});
  } else {
    for (size_t start = nul + 1; start <= input.size();) {
      const size_t end = std::min(input.find('\0', start), input.size());
      args.push_back(input.substr(start, end - start));
      start = end + 1;
    }
  }
  std::vector<const char*> argv;
  for (std::string& arg : args) {
    if (arg == "@config") arg = config_path();
    argv.push_back(arg.c_str());
  }

  CommandLine cli;
  try {
    cli = parse_command_line(static_cast<int>(argv.size()), argv.data());
  } catch (const Error&) {
    return;
  }
  read_sections(cli);
  require(!command_line_help("fuzz", cli.trainer).empty(), "command_line_help describes the options");
  // Whatever was taken can be written out as JSON: its strings are UTF-8.
  const json written = cli.trainer;
  const std::string text = written.dump();
  (void)cli.sections.dump();
  try {
    check_options(cli.trainer);
  } catch (const Error&) {
    return;
  }
  // Options a Trainer accepts read back from their JSON as the same options.
  detail::JsonInput reread = detail::read_json(text);
  require(reread.error.empty(), "the JSON of accepted options reads back");
  require(json(reread.value.get<TrainerOptions>()) == written, "accepted options survive a round trip through JSON");
}

}  // namespace fulgor::fuzz

FULGOR_FUZZ_TARGET(fulgor::fuzz::options)
