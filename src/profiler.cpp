#include "fulgor/profiler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <utility>
#include <vector>

#include "fulgor/core/error.h"

namespace fulgor {

namespace {

// Python's f"{x:.5}" (Lightning's number format): five significant digits
// without trailing zeros, fixed-point (with at least one decimal) for
// decimal exponents from -4 to 3, else exponent notation.
std::string five_digits(double x) {
  if (!std::isfinite(x)) return fmt::format("{}", x);
  auto strip_zeros = [](std::string digits) {
    if (digits.find('.') == std::string::npos) return digits;
    digits.erase(digits.find_last_not_of('0') + 1);
    if (digits.back() == '.') digits.pop_back();
    return digits;
  };
  const std::string scientific = fmt::format("{:.4e}", x);  // the exponent after rounding
  const auto e = scientific.find('e');
  const int exponent = std::stoi(scientific.substr(e + 1));
  if (exponent < -4 || exponent >= 4) return strip_zeros(scientific.substr(0, e)) + scientific.substr(e);
  std::string fixed = strip_zeros(fmt::format("{:.{}f}", x, 4 - exponent));
  if (fixed.find('.') == std::string::npos) fixed += ".0";
  return fixed;
}

// Python's str.expandtabs(8) length of a line.
size_t expanded_length(const std::string& line) {
  size_t column = 0;
  for (char c : line) column = c == '\t' ? (column / 8 + 1) * 8 : column + 1;
  return column;
}

// Lightning's log_row_extended, without its leading line separator.
std::string row(const std::string& action, size_t width, const std::string& mean, const std::string& calls,
                const std::string& total, const std::string& percentage) {
  return fmt::format("|  {:<{}}\t|  {:<15}\t|  {:<15}\t|  {:<15}\t|  {:<15}\t|", action, width, mean, calls, total,
                     percentage);
}

// Lightning's Profiler._prepare_filename: the parts joined by '-', with
// characters that a path cannot hold replaced by '_'.
std::string report_filename(const std::string& stage, const std::string& filename, std::optional<int64_t> rank) {
  std::string base = stage + "-" + filename;
  if (rank) base += "-" + std::to_string(*rank);
  std::string clean;
  for (char c : base) {
    const bool bad = std::string_view("\\/:*?\"<>|\n\r\t").find(c) != std::string_view::npos;
    const char out = bad ? '_' : c;
    if (out == '_' && !clean.empty() && clean.back() == '_') continue;
    clean += out;
  }
  return clean + ".txt";
}

}  // namespace

SimpleProfiler::SimpleProfiler(std::string dirpath, std::string filename)
    : dirpath_(std::move(dirpath)), filename_(std::move(filename)), start_(Clock::now()) {}

const SimpleProfiler::Action* SimpleProfiler::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

SimpleProfiler::Action& SimpleProfiler::action(std::string_view name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return *it->second;
  Action& added = actions_.emplace_back();
  added.name = std::string(name);
  by_name_.emplace(added.name, &added);
  return added;
}

double SimpleProfiler::elapsed_seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

std::string SimpleProfiler::summary(const std::string& stage) const {
  std::string upper = stage;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  std::string out = upper + " Profiler Report\n";
  std::vector<const Action*> recorded;
  for (const auto& a : actions_)
    if (a.calls > 0) recorded.push_back(&a);
  if (!recorded.empty()) {
    size_t width = 0;
    for (const auto* a : recorded) width = std::max(width, a->name.size());
    const double elapsed = elapsed_seconds();
    // Lightning sorts by percentage, which orders as the total time does.
    std::stable_sort(recorded.begin(), recorded.end(),
                     [](const Action* a, const Action* b) { return a->total_seconds > b->total_seconds; });
    int64_t calls = 0;
    for (const auto* a : recorded) calls += a->calls;
    const std::string header = row("Action", width, "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %");
    // Lightning measures the header with its leading line separator.
    const std::string rule = "\n" + std::string(expanded_length(header) + 1, '-');
    out += rule + "\n" + header + rule;
    out += "\n" + row("Total", width, "-", std::to_string(calls), five_digits(elapsed), "100 %");
    out += rule;
    for (const auto* a : recorded)
      out += "\n" + row(a->name, width, five_digits(a->mean_seconds()), std::to_string(a->calls),
                        five_digits(a->total_seconds), five_digits(100.0 * a->total_seconds / elapsed));
    out += rule;
  }
  return out + "\n";
}

void SimpleProfiler::describe(const std::string& stage, const std::string& log_dir, std::optional<int64_t> rank,
                              bool print) const {
  if (filename_.empty()) {
    if (print) std::cout << summary(stage) << std::flush;
    return;
  }
  const std::filesystem::path dir = dirpath_.empty() ? log_dir : dirpath_;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const auto path = dir / report_filename(stage, filename_, rank);
  std::ofstream file(path, std::ios::app);
  file << summary(stage);
  file.flush();
  if (!file) throw Error(fmt::format("cannot write the profiler report to {}", path.string()));
}

}  // namespace fulgor
