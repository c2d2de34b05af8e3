#pragma once

// A small side-by-side benchmark harness: runs the variants of a measurement
// interleaved so that drifts of a noisy machine hit them alike, and reports
// medians.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
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

/// A confidence interval of at least 95% for the median of the distribution
/// `values` are independent draws from, whatever that distribution is: the
/// j-th smallest and j-th largest values, for the largest j with
/// P(Binomial(n, 1/2) < j) <= 2.5%. Below 6 values it is their range, which
/// covers less than 95%.
inline std::pair<double, double> median_interval(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  size_t j = 1;
  double pmf = std::pow(0.5, static_cast<double>(n));  // P(B = j - 1)
  double below = pmf;                                  // P(B < j)
  while (j < n / 2) {
    pmf *= static_cast<double>(n - j + 1) / static_cast<double>(j);
    if (below + pmf > 0.025) break;
    below += pmf;
    ++j;
  }
  return {values[j - 1], values[n - j]};
}

/// Runs every variant `repeats` times, interleaved, after one warm-up round;
/// returns each variant's times in seconds, round by round. The order turns
/// round about (a, b, b, a, a, b, ...) so that whatever favours the first or
/// the second run of a round favours each variant alike.
inline std::vector<std::vector<double>> interleaved_times(const std::vector<std::function<void()>>& variants,
                                                          int repeats) {
  for (const auto& v : variants) v();
  const size_t n = variants.size();
  std::vector<std::vector<double>> times(n);
  for (int r = 0; r < repeats; ++r)
    for (size_t k = 0; k < n; ++k) {
      const size_t i = r % 2 ? n - 1 - k : k;
      times[i].push_back(seconds_of(variants[i]));
    }
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
