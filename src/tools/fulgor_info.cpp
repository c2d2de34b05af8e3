// fulgor-info: what this fulgor, its LibTorch and its accelerators look like
// on this machine.
//
//   fulgor-info [--plugin PATH]...
//
// Loads the plugins FULGOR_ACCELERATOR_PLUGINS and --plugin name, then prints
// the versions and one row per registered accelerator. Exits 1 with the error
// when a plugin fails to load, 2 on a bad command line.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <iostream>

#include "fulgor/fulgor.h"

namespace {

int usage(const std::string& problem) {
  std::cerr << "fulgor-info: " << problem << "\nusage: fulgor-info [--plugin PATH]...\n";
  return 2;
}

void print_table(const std::vector<fulgor::AcceleratorInfo>& infos) {
  std::vector<std::vector<std::string>> rows = {{"name", "available", "devices", "backend", "priority", "details"}};
  for (const auto& info : infos)
    rows.push_back({info.name, info.available ? "yes" : "no", std::to_string(info.device_count),
                    info.distributed_backend, std::to_string(info.priority),
                    info.available ? info.description : info.reason});
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i)
      line += i + 1 == row.size() ? row[i] : fmt::format("{:<{}}  ", row[i], widths[i]);
    std::cout << line << '\n';
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> plugins;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--plugin") {
      if (i + 1 == argc) return usage("--plugin needs a path");
      plugins.push_back(argv[++i]);
    } else if (arg.rfind("--plugin=", 0) == 0) {
      plugins.push_back(arg.substr(std::strlen("--plugin=")));
    } else if (arg == "-h" || arg == "--help") {
      std::cout << "usage: fulgor-info [--plugin PATH]...\n";
      return 0;
    } else {
      return usage(fmt::format("unknown argument '{}'", arg));
    }
  }
  try {
    auto& registry = fulgor::AcceleratorRegistry::instance();
    for (const auto& path : plugins) fulgor::load_accelerator_plugin(path);
    std::cout << fmt::format("fulgor {} (plugin ABI {}), LibTorch {}\n", fulgor::version(),
                             fulgor::plugin_abi_version(), fulgor::torch_version());
    const fulgor::BlasInfo blas = fulgor::blas_info();
    const std::string where = blas.linked_into_libtorch ? " (linked into LibTorch)"
                              : blas.path.empty()       ? ""
                                                        : " (" + blas.path + ")";
    std::cout << fmt::format("BLAS: {}{}{}{}; LibTorch threads: {}\n", blas.name, where,
                             blas.threads > 0 ? fmt::format(", {} threads", blas.threads) : "",
                             blas.threading.empty() ? "" : fmt::format(" ({} build)", blas.threading),
                             fulgor::torch_threads());
    print_table(registry.describe());
    std::cout << "auto selects: " << registry.resolve("auto") << '\n';
  } catch (const std::exception& e) {
    std::cerr << "fulgor-info: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
