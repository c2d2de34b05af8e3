#pragma once

// A small side-by-side benchmark harness: runs the variants of a measurement
// interleaved (a, b, a, b, ...) so that drifts of a noisy machine hit them
// alike, and reports medians.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fulgor::bench {

inline double seconds_of(const std::function<void()>& run) {
  auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

/// Runs every variant `repeats` times, interleaved (a, b, a, b, ...), after
/// one warm-up round; returns each variant's times in seconds, in run order.
inline std::vector<std::vector<double>> interleaved_times(const std::vector<std::function<void()>>& variants,
                                                          int repeats) {
  for (const auto& v : variants) v();
  std::vector<std::vector<double>> times(variants.size());
  for (int r = 0; r < repeats; ++r)
    for (size_t i = 0; i < variants.size(); ++i) times[i].push_back(seconds_of(variants[i]));
  return times;
}

/// Each variant's median seconds over interleaved runs.
inline std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& variants, int repeats) {
  std::vector<double> medians;
  for (auto& t : interleaved_times(variants, repeats)) medians.push_back(median(t));
  return medians;
}

/// A row of the printed table, and the figures that go into the final JSON line.
struct Report {
  std::vector<std::vector<std::string>> rows;
  std::map<std::string, double> figures;

  void row(std::vector<std::string> cells) { rows.push_back(std::move(cells)); }
  void print() const;
};

}  // namespace fulgor::bench
