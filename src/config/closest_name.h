#pragma once

// The messages for unknown option names: the known name nearest to the one
// given, as a typo's correction. Inline: the options and the command line use it.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

namespace fulgor::detail {

// Damerau-Levenshtein distance in its optimal-string-alignment form: a typed
// "acclerator" or "max_epcohs" is one edit from the option meant.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

/// The name among `known` nearest to `name` by edit distance (insertions,
/// deletions, substitutions and swaps of neighbours, one each), when it is
/// near enough to be the one meant: at most 2 edits, or a third of the name's
/// length for longer names. "" when none is (or on a tie between two).
inline std::string closest_name(const std::string& name, const std::vector<std::string>& known) {
  const size_t near_enough = std::max<size_t>(2, name.size() / 3);
  std::string best;
  size_t best_distance = near_enough + 1;
  bool tie = false;
  for (const auto& candidate : known) {
    const size_t distance = edit_distance(name, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
      tie = false;
    } else if (distance == best_distance) {
      tie = true;
    }
  }
  return tie ? "" : best;
}

/// "unknown KIND 'name'" and then "; did you mean 'x'?" when a known name is
/// that close, else "; known: a, b, c" (or "; none are known" when `known` is empty).
inline std::string unknown_name_message(const std::string& kind, const std::string& name,
                                        const std::vector<std::string>& known) {
  if (const std::string closest = closest_name(name, known); !closest.empty())
    return fmt::format("unknown {} '{}'; did you mean '{}'?", kind, name, closest);
  if (known.empty()) return fmt::format("unknown {} '{}'; none are known", kind, name);
  return fmt::format("unknown {} '{}'; known: {}", kind, name, fmt::join(known, ", "));
}

}  // namespace fulgor::detail
