// Loading and saving a state dict of 200 MB (20 MB with --quick) with
// torch_load and save_state_dict, against Python's torch.load and torch.save
// of the same file in the same run (Debian's python3 with python3-torch).

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "benchmarks.h"
#include "fulgor/interop/state_dict.h"
#include "fulgor/interop/torch_load.h"
#include "fulgor/interop/torch_save.h"

namespace fulgor::bench {
namespace {

nlohmann::json python_reference(const std::filesystem::path& file, const std::filesystem::path& out, int repeats) {
  std::string command = fmt::format("/usr/bin/python3 {}/interop_reference.py {} {} {}", FULGOR_BENCHMARKS_DIR,
                                    file.string(), out.string(), repeats);
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  if (pipe == nullptr || pclose(pipe) != 0) throw std::runtime_error("the Python reference failed: " + command);
  return nlohmann::json::parse(output);
}

}  // namespace

void interop_benchmark(Report& report, const Settings& settings) {
  const int64_t tensors = 50, elements = settings.quick ? 100'000 : 1'000'000;  // 4 MB each, 200 MB in all
  const auto dir = std::filesystem::temp_directory_path() / "fulgor-interop-benchmark";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  StateDict state;
  for (int64_t i = 0; i < tensors; ++i) state.insert(fmt::format("layer{}.weight", i), torch::randn({elements}));
  const auto file = dir / "state.pt", out = dir / "again.pt";
  save_state_dict(state, file);
  auto times = interleaved_medians(
      {[&] { torch_load(file); }, [&] { save_state_dict(state, out); }}, settings.repeats);
  nlohmann::json python = python_reference(file, dir / "python.pt", settings.repeats);
  const double megabytes = std::filesystem::file_size(file) / 1e6;
  const double load_ratio = times[0] / python["load"].get<double>(), save_ratio = times[1] / python["save"].get<double>();
  report.row({"interop", fmt::format("torch.load, {:.0f} MB", megabytes),
              fmt::format("{:.0f} ms", python["load"].get<double>() * 1e3), ""});
  report.row({"interop", "fulgor::torch_load (CRC-32 checked)", fmt::format("{:.0f} ms", times[0] * 1e3),
              fmt::format("{:.2f}x torch.load", load_ratio)});
  report.row({"interop", "torch.save", fmt::format("{:.0f} ms", python["save"].get<double>() * 1e3), ""});
  report.row({"interop", "fulgor::save_state_dict", fmt::format("{:.0f} ms", times[1] * 1e3),
              fmt::format("{:.2f}x torch.save", save_ratio)});
  report.figures["interop_load_ratio"] = load_ratio;
  report.figures["interop_save_ratio"] = save_ratio;
  std::filesystem::remove_all(dir);
}

}  // namespace fulgor::bench
