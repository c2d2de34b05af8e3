#pragma once

#include <exception>
#include <iostream>
#include <string>
#include <type_traits>

#include "fulgor/core/error.h"

namespace fulgor {

/// Runs a program's body and turns an error it throws into a message and an
/// exit status, so that a typo on the command line ends the program cleanly
/// rather than in `terminate called after throwing...` and an abort:
///
///   int main(int argc, char** argv) {
///     return fulgor::run_main(argc, argv, [&] {
///       auto cli = fulgor::parse_command_line(argc, argv, defaults, sections);
///       ...
///     });
///   }
///
/// Ensures: returns what `body` returns (0 when it returns nothing). When
/// `body` throws a std::exception, prints "PROGRAM: MESSAGE" on stderr, where
/// PROGRAM is the file name of argv[0], and returns 2 for a ConfigError (a
/// command line, config file or option fulgor refuses; LightningCLI's status
/// for a bad command line) and 1 for any other error (a fulgor::Error, or one
/// from LibTorch or the program). Nothing is caught that is not a
/// std::exception.
template <typename Body>
int run_main(int argc, const char* const* argv, Body&& body);

namespace impl {

inline int report_main_error(int argc, const char* const* argv, const std::exception& error) {
  std::string program = argc > 0 && argv[0] != nullptr ? argv[0] : "fulgor";
  program.erase(0, program.find_last_of('/') + 1);  // npos + 1 erases nothing
  std::cerr << program << ": " << error.what() << std::endl;
  return dynamic_cast<const ConfigError*>(&error) != nullptr ? 2 : 1;
}

}  // namespace impl

template <typename Body>
int run_main(int argc, const char* const* argv, Body&& body) {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Body&>>) {
      body();
      return 0;
    } else {
      return body();
    }
  } catch (const std::exception& error) {
    return impl::report_main_error(argc, argv, error);
  }
}

}  // namespace fulgor
