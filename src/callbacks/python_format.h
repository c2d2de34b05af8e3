#pragma once

// Numbers written as Python writes them, for the file names and messages that
// Lightning builds with str.format.

#include <fmt/format.h>

#include <string>

namespace fulgor::detail {

// Python's repr of a float: the shortest text that reads back the same, with
// ".0" on whole numbers (5.0, not 5).
inline std::string python_repr(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

}  // namespace fulgor::detail
