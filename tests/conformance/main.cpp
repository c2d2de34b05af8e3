// fulgor-conformance: runs one accelerator through the checks every fulgor
// accelerator must pass, with the CPU as the reference (docs/conformance.md).
//
//   fulgor-conformance --accelerator NAME [--plugin PATH]... [--devices SPEC]
//                      [--rtol X] [--atol X] [--skip-unavailable]
//
// Prints one PASS or FAIL line per check and then "N passed, N failed".
// With --fit-at-defaults it only fits the conformance model with a Trainer at
// its defaults on the accelerator and prints, from rank 0, what the check
// fit_at_defaults reads (that check runs the program again so).
// Exit status: 0 when every check passed, 1 when one failed, 2 when the checks
// could not start (bad command line, a plugin that does not load, an unknown
// accelerator), 77 when the accelerator is unavailable and --skip-unavailable
// was given.

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>

#include "checks.h"
#include "fulgor/fulgor.h"

namespace {

constexpr int kFailed = 1;
constexpr int kCannotStart = 2;
// The exit status automake and ctest's SKIP_RETURN_CODE use for a skipped test.
constexpr int kSkipped = 77;

const char* kUsage =
    "usage: fulgor-conformance --accelerator NAME [--plugin PATH]... [--devices SPEC]\n"
    "                          [--rtol X] [--atol X] [--skip-unavailable]\n"
    "  --accelerator NAME   the accelerator to check (a registered name, \"auto\" or \"gpu\")\n"
    "  --plugin PATH        load an accelerator plugin first (repeatable)\n"
    "  --devices SPEC       the devices the per-device checks run on (default \"auto\")\n"
    "  --rtol X, --atol X   tolerance against the CPU: |device - cpu| <= atol + rtol * |cpu|\n"
    "                       (defaults 1e-3 and 1e-4)\n"
    "  --skip-unavailable   exit 77 instead of failing when the accelerator is unavailable\n"
    "  --fit-at-defaults    only fit with a Trainer at its defaults, as the check fit_at_defaults does\n";

int usage(const std::string& problem) {
  std::cerr << "fulgor-conformance: " << problem << '\n' << kUsage;
  return kCannotStart;
}

std::optional<double> parse_tolerance(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(value >= 0)) return std::nullopt;
  return value;
}

int fit_at_defaults_only(const std::string& accelerator) {
  try {
    const auto run = fulgor::conformance::fit_at_defaults(accelerator);
    if (run.global_zero)
      std::cout << fmt::format("fit_at_defaults world_size {} steps {} last_loss {}", run.world_size, run.steps,
                               run.last_loss)
                << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fulgor-conformance: " << e.what() << std::endl;
    return kFailed;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string name;
  std::vector<std::string> plugins;
  bool skip_unavailable = false;
  bool fit_at_defaults = false;
  fulgor::conformance::Options options;
  options.command.assign(argv, argv + argc);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 == argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--skip-unavailable") {
      skip_unavailable = true;
    } else if (arg == "--fit-at-defaults") {
      fit_at_defaults = true;
    } else if (arg == "--accelerator" || arg == "--plugin" || arg == "--devices" || arg == "--rtol" ||
               arg == "--atol") {
      const std::optional<std::string> v = value();
      if (!v) return usage(arg + " needs a value");
      if (arg == "--accelerator") {
        name = *v;
      } else if (arg == "--plugin") {
        plugins.push_back(*v);
      } else if (arg == "--devices") {
        options.devices = *v;
      } else {
        const std::optional<double> tolerance = parse_tolerance(*v);
        if (!tolerance) return usage(fmt::format("{} {} is not a number >= 0", arg, *v));
        (arg == "--rtol" ? options.tolerance.rtol : options.tolerance.atol) = *tolerance;
      }
    } else {
      return usage(fmt::format("unknown argument '{}'", arg));
    }
  }
  if (name.empty()) return usage("--accelerator is required");

  std::unique_ptr<fulgor::Accelerator> accelerator;
  try {
    auto& registry = fulgor::AcceleratorRegistry::instance();
    for (const std::string& path : plugins) fulgor::load_accelerator_plugin(path);
    // An explicit name is checked even when unavailable; "auto" and "gpu" only
    // ever pick an available one.
    accelerator = registry.create(name);
  } catch (const std::exception& e) {
    std::cerr << "fulgor-conformance: " << e.what() << '\n';
    return kCannotStart;
  }

  if (fit_at_defaults) return fit_at_defaults_only(accelerator->name());
  std::cout << fmt::format("fulgor-conformance {}, LibTorch {}: accelerator '{}' ({})\n", fulgor::version(),
                           fulgor::torch_version(), accelerator->name(), accelerator->description());
  const fulgor::Availability availability = accelerator->availability();
  if (!availability.available && skip_unavailable) {
    std::cout << fmt::format("SKIP {}: unavailable: {}\n", accelerator->name(), availability.reason);
    return kSkipped;
  }
  std::cout << fmt::format("tolerance against the CPU (float32): |device - cpu| <= {:g} + {:g} * |cpu|\n",
                           options.tolerance.atol, options.tolerance.rtol);

  fulgor::conformance::Report report;
  fulgor::conformance::run_checks(*accelerator, options, report);
  std::cout << fmt::format("{} passed, {} failed\n", report.passed(), report.failed());
  return report.failed() == 0 ? 0 : kFailed;
}
