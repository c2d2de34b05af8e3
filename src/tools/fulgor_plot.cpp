// fulgor-plot: draws a run's metrics.csv (as CSVLogger writes it) as an SVG of
// its curves, against the step.
//
//   fulgor-plot METRICS_CSV [-o OUT.svg]
//
// One panel per metric, with the stages' values of it overlaid: train_loss,
// val_loss and test_loss (and train_loss_step, train_loss_epoch) share the
// panel "loss". The `epoch` column is left out. Without -o the SVG goes
// beside the CSV, named after it (metrics.svg). Exits 2 on a bad command line
// and 1 when the CSV cannot be read or has nothing to draw, saying why.
//
// It needs no LibTorch, so it links neither libfulgor nor LibTorch.

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "detail/read_at.h"
#include "detail/regular_file.h"

namespace {

struct UsageError {
  std::string message;
};

const char* const kUsage = "usage: fulgor-plot METRICS_CSV [-o OUT.svg]\n";

struct Options {
  std::string csv;
  std::string svg;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-o" || arg == "--output") {
      if (i + 1 == argc) throw UsageError{arg + " needs a file name"};
      options.svg = argv[++i];
    } else if (arg == "-h" || arg == "--help") {
      throw UsageError{""};
    } else if (!arg.empty() && arg[0] == '-') {
      throw UsageError{"unknown option '" + arg + "'"};
    } else if (options.csv.empty()) {
      options.csv = arg;
    } else {
      throw UsageError{"one CSV file at a time, got '" + options.csv + "' and '" + arg + "'"};
    }
  }
  if (options.csv.empty()) throw UsageError{"no CSV file given"};
  if (options.svg.empty()) {
    const auto dot = options.csv.rfind('.');
    const auto slash = options.csv.rfind('/');
    const bool has_extension = dot != std::string::npos && (slash == std::string::npos || dot > slash);
    options.svg = (has_extension ? options.csv.substr(0, dot) : options.csv) + ".svg";
  }
  return options;
}

// ---- Reading the CSV -----------------------------------------------------------

struct Series {
  std::string metric;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

bool parse_number(const std::string& text, double& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(value);
}

// The whole file at `path`, a regular file (Note [Opening a user's path]).
std::string read_text(const std::string& path) {
  const auto file = fulgor::detail::open_regular<std::runtime_error>(path, "");
  std::string text(file.size(), '\0');
  if (!fulgor::detail::read_at(file.fd(), 0, text.data(), text.size()))
    throw std::runtime_error(
        fmt::format("'{}' cannot be read: {}", path, errno != 0 ? std::strerror(errno) : "it shrank"));
  return text;
}

// Every column but step and epoch, as (step, value) points where the row has
// a finite value; columns with none are left out.
std::vector<Series> read_csv(const std::string& path) {
  std::istringstream in(read_text(path));
  std::string line;
  if (!std::getline(in, line)) throw std::runtime_error(fmt::format("'{}' is empty", path));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  const auto header = split(line);
  const auto step_at = std::find(header.begin(), header.end(), "step");
  if (step_at == header.end())
    throw std::runtime_error(fmt::format("'{}' has no 'step' column (its columns: {})", path, line));
  const size_t step_column = static_cast<size_t>(step_at - header.begin());
  std::vector<Series> columns(header.size());
  for (size_t i = 0; i < header.size(); ++i) columns[i].metric = header[i];
  for (int row = 2; std::getline(in, line); ++row) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto cells = split(line);
    double step = 0;
    if (cells.size() <= step_column || !parse_number(cells[step_column], step))
      throw std::runtime_error(fmt::format("'{}', line {}: no step number in '{}'", path, row, line));
    for (size_t i = 0; i < cells.size() && i < columns.size(); ++i) {
      double value = 0;
      if (i != step_column && parse_number(cells[i], value)) columns[i].points.emplace_back(step, value);
    }
  }
  std::vector<Series> series;
  for (auto& column : columns)
    if (column.metric != "step" && column.metric != "epoch" && !column.points.empty())
      series.push_back(std::move(column));
  if (series.empty()) throw std::runtime_error(fmt::format("'{}' has no numeric values to plot", path));
  return series;
}

// ---- Grouping -------------------------------------------------------------------

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The panel a metric goes to: its name without the stage ("train_", "val_",
// "test_") and without Lightning's "_step"/"_epoch" suffixes.
std::string panel_of(std::string metric) {
  for (const char* stage : {"train_", "val_", "validation_", "test_"})
    if (starts_with(metric, stage) && metric.size() > std::strlen(stage)) {
      metric = metric.substr(std::strlen(stage));
      break;
    }
  for (const char* suffix : {"_step", "_epoch"})
    if (ends_with(metric, suffix) && metric.size() > std::strlen(suffix)) {
      metric.resize(metric.size() - std::strlen(suffix));
      break;
    }
  return metric;
}

std::string colour_of(const std::string& metric, size_t index) {
  if (starts_with(metric, "train_")) return ends_with(metric, "_epoch") ? "#1f3f8f" : "#1f77b4";
  if (starts_with(metric, "val_") || starts_with(metric, "validation_")) return "#ff7f0e";
  if (starts_with(metric, "test_")) return "#2ca02c";
  static const char* const others[] = {"#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return others[index % (sizeof others / sizeof others[0])];
}

// ---- Drawing --------------------------------------------------------------------

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// About `count` round tick values (1, 2 or 5 times a power of ten apart, and
// at least `min_step`) covering [low, high], which they widen to.
std::vector<double> ticks(double& low, double& high, int count, double min_step = 0) {
  if (high <= low) {
    const double pad = low == 0 ? 1 : std::abs(low) * 0.1;
    low -= pad;
    high += pad;
  }
  const double rough = (high - low) / count;
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  const double fraction = rough / power;
  const double step = std::max(min_step, (fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10) * power);
  low = std::floor(low / step) * step;
  high = std::ceil(high / step) * step;
  std::vector<double> values;
  for (double v = low; v <= high + step / 2; v += step) values.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return values;
}

std::string label(double v) { return fmt::format("{:.6g}", v); }

constexpr double kPanelWidth = 480, kPanelHeight = 300;
constexpr double kLeft = 64, kRight = 16, kTop = 32, kBottom = 44;

// Where a panel draws, and its data's ranges mapped onto it.
struct Frame {
  double left, right, top, bottom;
  double xmin, xmax, ymin, ymax;
  double px(double x) const { return left + (x - xmin) / (xmax - xmin) * (right - left); }
  double py(double y) const { return bottom - (y - ymin) / (ymax - ymin) * (bottom - top); }
};

void draw_axes(std::ostringstream& svg, const std::string& name, const Frame& f, const std::vector<double>& xticks,
               const std::vector<double>& yticks, double x0, double y0) {
  svg << fmt::format(
      "<text class=\"title\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
      (f.left + f.right) / 2, y0 + 20, escape(name));
  svg << fmt::format(
      "<rect class=\"axes\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#444\"/>\n",
      f.left, f.top, f.right - f.left, f.bottom - f.top);
  svg << "<g class=\"x-ticks\" font-size=\"11\" text-anchor=\"middle\">\n";
  for (double t : xticks)
    svg << fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#444\"/>"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\">{4}</text>\n",
        f.px(t), f.bottom, f.bottom + 4, f.bottom + 16, label(t));
  svg << "</g>\n<g class=\"y-ticks\" font-size=\"11\" text-anchor=\"end\">\n";
  for (double t : yticks)
    svg << fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\">{5}</text>\n",
        f.left, f.py(t), f.right, f.left - 6, f.py(t) + 4, label(t));
  svg << "</g>\n";
  svg << fmt::format("<text class=\"x-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n",
                     (f.left + f.right) / 2, f.bottom + 34);
  svg << fmt::format(
      "<text class=\"y-label\" transform=\"translate({:.1f},{:.1f}) rotate(-90)\" "
      "text-anchor=\"middle\">{}</text>\n",
      x0 + 14, (f.top + f.bottom) / 2, escape(name));
}

void draw_series(std::ostringstream& svg, const std::vector<const Series*>& series, const Frame& f) {
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = *series[i];
    const std::string colour = colour_of(s.metric, i);
    std::string points;
    for (const auto& [x, y] : s.points)
      points += fmt::format("{}{:.2f},{:.2f}", points.empty() ? "" : " ", f.px(x), f.py(y));
    svg << fmt::format(
        "<polyline class=\"series\" data-metric=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"1.5\"/>\n",
        escape(s.metric), points, colour);
    // Few points (a value per epoch) are marked, and a lone one is visible at all.
    if (s.points.size() <= 30)
      for (const auto& [x, y] : s.points)
        svg << fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2.5\" fill=\"{}\"/>\n", f.px(x), f.py(y), colour);
  }
  svg << "<g class=\"legend\" font-size=\"11\">\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const double y = f.top + 14 + 16 * static_cast<double>(i);
    svg << fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
        f.right - 28, y - 4, f.right - 8, y - 4, colour_of(series[i]->metric, i), f.right - 32, y,
        escape(series[i]->metric));
  }
  svg << "</g>\n";
}

// `steps`: the run's first and last step, which every panel spans.
void draw_panel(std::ostringstream& svg, const std::string& name, const std::vector<const Series*>& series,
                std::pair<double, double> steps, double x0, double y0) {
  double xmin = steps.first, xmax = steps.second, ymin = INFINITY, ymax = -INFINITY;
  for (const auto* s : series)
    for (const auto& point : s->points) ymin = std::min(ymin, point.second), ymax = std::max(ymax, point.second);
  const auto xticks = ticks(xmin, xmax, 6, /*min_step=*/1);  // widening the ranges to the ticks
  const auto yticks = ticks(ymin, ymax, 5);
  const Frame frame{x0 + kLeft, x0 + kPanelWidth - kRight, y0 + kTop, y0 + kPanelHeight - kBottom, xmin, xmax, ymin,
                    ymax};
  svg << fmt::format("<g class=\"panel\" data-panel=\"{}\">\n", escape(name));
  draw_axes(svg, name, frame, xticks, yticks, x0, y0);
  draw_series(svg, series, frame);
  svg << "</g>\n";
}

std::string render(const std::vector<Series>& series) {
  // Panels in the order their first metric comes in the CSV.
  std::vector<std::pair<std::string, std::vector<const Series*>>> panels;
  for (const auto& s : series) {
    const std::string name = panel_of(s.metric);
    auto it = std::find_if(panels.begin(), panels.end(), [&](const auto& p) { return p.first == name; });
    if (it == panels.end()) {
      panels.emplace_back(name, std::vector<const Series*>{});
      it = panels.end() - 1;
    }
    it->second.push_back(&s);
  }
  std::pair<double, double> steps{INFINITY, -INFINITY};
  for (const auto& s : series)
    for (const auto& point : s.points)
      steps = {std::min(steps.first, point.first), std::max(steps.second, point.first)};
  const size_t columns = panels.size() == 1 ? 1 : 2;
  const size_t rows = (panels.size() + columns - 1) / columns;
  const double width = kPanelWidth * static_cast<double>(columns), height = kPanelHeight * static_cast<double>(rows);
  std::ostringstream svg;
  svg << fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      width, height);
  for (size_t i = 0; i < panels.size(); ++i)
    draw_panel(svg, panels[i].first, panels[i].second, steps, kPanelWidth * static_cast<double>(i % columns),
               kPanelHeight * static_cast<double>(i / columns));
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const UsageError& e) {
    if (e.message.empty()) {
      std::cout << kUsage;
      return 0;
    }
    std::cerr << "fulgor-plot: " << e.message << '\n' << kUsage;
    return 2;
  }
  try {
    const std::string svg = render(read_csv(options.csv));
    fulgor::detail::check_output<std::runtime_error>(options.svg);  // a FIFO would wait for a reader
    std::ofstream out(options.svg, std::ios::trunc);
    out << svg;
    out.flush();
    if (!out) throw std::runtime_error(fmt::format("cannot write '{}': {}", options.svg, std::strerror(errno)));
    std::cout << options.svg << '\n';
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fulgor-plot: " << e.what() << '\n';
    return 1;
  }
}
