// fulgor-benchmarks: every benchmark, side by side with its hand-written
// LibTorch counterpart, as one table; the last line is a JSON object of the
// headline figures.
//
//   fulgor-benchmarks [--quick] [--only NAME]... [--device NAME]
//
// The gpu benchmark (steps per second on an accelerator, --device, cuda by
// default) runs only when named: fulgor-benchmarks --only gpu.
// Run it on an idle machine with one LibTorch thread (OMP_NUM_THREADS=1) and
// OpenBLAS for figures comparable to docs/benchmarks.md.

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <iostream>

#include "benchmarks.h"
#include "fulgor/core/runtime_info.h"
#include "fulgor/core/version.h"

namespace fulgor::bench {

void Report::print() const {
  std::vector<size_t> widths;
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) {
      if (widths.size() <= i) widths.push_back(0);
      widths[i] = std::max(widths[i], row[i].size());
    }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) line += fmt::format("{:<{}}  ", row[i], widths[i]);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::cout << line << '\n';
  }
}

}  // namespace fulgor::bench

int main(int argc, char** argv) {
  using namespace fulgor::bench;
  Settings settings;
  std::vector<std::string> only;
  if (argc == 2 && std::strcmp(argv[1], "--instructions-child") == 0) return instructions_child();
  if (argc == 6 && std::strcmp(argv[1], "--sharded-child") == 0)
    return sharded_child(argv[2], std::stoll(argv[3]), std::stoll(argv[4]), argv[5]);
  if (argc == 5 && std::strcmp(argv[1], "--distributed-checkpoint-child") == 0)
    return distributed_checkpoint_child(std::stoll(argv[2]), std::stoi(argv[3]), argv[4]);
  if (argc == 6 && std::strcmp(argv[1], "--overhead-child") == 0)
    return overhead_child(argv[2], std::stoul(argv[3]), std::stoi(argv[4]), std::strcmp(argv[5], "1") == 0);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      settings.quick = true;
      settings.repeats = 2;
      settings.processes = 1;
      settings.gpu_repeats = 2;
    } else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      settings.device = argv[++i];
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only.push_back(argv[++i]);
    } else if (std::strcmp(argv[i], "--overhead-model") == 0 && i + 1 < argc) {
      settings.overhead_models.push_back(argv[++i]);
    } else if (std::strcmp(argv[i], "--overhead-variant") == 0 && i + 1 < argc) {
      settings.overhead_variants.push_back(argv[++i]);
    } else {
      std::cerr << "usage: fulgor-benchmarks [--quick] "
                   "[--only overhead|instructions|data|checkpoint|interop|precision|c_api|sharded|gpu]... [--device NAME] "
                   "[--overhead-model linear|mlp|cnn]... [--overhead-variant NAME]...\n";
      return 2;
    }
  }
  const std::vector<std::pair<std::string, void (*)(Report&, const Settings&)>> benchmarks = {
      {"overhead", overhead_benchmark},     {"instructions", instructions_benchmark}, {"data", data_benchmark},
      {"checkpoint", checkpoint_benchmark}, {"interop", interop_benchmark},           {"precision", precision_benchmark},
      {"c_api", c_api_benchmark},          {"sharded", sharded_benchmark},           {"gpu", gpu_benchmark},
  };
  fulgor::BlasInfo blas = fulgor::blas_info();
  std::cout << fmt::format("fulgor {}, LibTorch {}, BLAS {}, {} LibTorch thread(s)\n", fulgor::version(),
                           fulgor::torch_version(), blas.name, fulgor::torch_threads());
  Report report;
  report.row({"benchmark", "variant", "median", "vs LibTorch"});
  for (const auto& [name, run] : benchmarks)
    if (std::find(only.begin(), only.end(), name) != only.end() || (only.empty() && name != "gpu"))
      run(report, settings);
  report.print();
  std::cout << nlohmann::json(report.figures).dump() << std::endl;
  return 0;
}
