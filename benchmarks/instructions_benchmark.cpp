// Instructions per training step, counted by callgrind: wall time on a busy
// machine drifts, instruction counts do not. The benchmark starts this program
// again under `valgrind --tool=callgrind` in a child mode that runs the
// hand-written loop and the Trainer for two numbers of steps each; callgrind
// zeroes its counters before and dumps them after each counted run (its
// --zero-before/--dump-after options, so no valgrind header is needed) and
// counts only inside it (--toggle-collect: a thread LibTorch starts during the
// first run would otherwise add its start-up to that run's count). The
// difference between the two lengths cancels set-up and teardown, leaving the
// per-step cost.

#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "benchmarks.h"
#include "loops.h"
#include "models.h"

namespace fulgor::bench {
namespace {

constexpr int64_t kShortSteps = 20, kLongSteps = 120;

const std::vector<Variant>& counted_variants() {
  static const std::vector<Variant> variants = {{"barebones", false, 0, false},
                                                {"progress bar + log()", true, 1, false}};
  return variants;
}

// The count callgrind wrote into one dump file ("totals: N" or "summary: N").
uint64_t instructions_in(const std::filesystem::path& dump) {
  std::ifstream in(dump);
  std::string line;
  while (std::getline(in, line))
    for (const char* key : {"totals: ", "summary: "})
      if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::strlen(key)));
  throw std::runtime_error("no instruction total in " + dump.string());
}

}  // namespace
}  // namespace fulgor::bench

// The functions callgrind's options name: unmangled, and never inlined.
extern "C" __attribute__((noinline)) void fulgor_bench_warm_run(const std::function<void()>* run) { (*run)(); }
extern "C" __attribute__((noinline)) void fulgor_bench_counted_run(const std::function<void()>* run) { (*run)(); }

namespace fulgor::bench {

// The child: one run of each (side, length), each between a zeroing and a dump.
int instructions_child() {
  torch::set_num_threads(1);
  const ModelSpec tiny = overhead_models().front();
  torch::manual_seed(1);
  const torch::nn::Sequential initial = tiny.make();
  const auto root = (std::filesystem::temp_directory_path() / "fulgor-instructions-benchmark").string();
  auto counted = [](const std::function<void()>& run) {
    fulgor_bench_warm_run(&run);  // first-use allocations and lazy initialisation
    fulgor_bench_counted_run(&run);
  };
  for (int64_t steps : {kShortSteps, kLongSteps}) {
    const Workload work = tiny.workload(steps * kBatch, 1);
    counted([&] { raw_fit(initial, work); });
    for (const Variant& variant : counted_variants()) counted([&] { fulgor_fit(initial, work, variant, root); });
  }
  std::filesystem::remove_all(root);
  return 0;
}

void instructions_benchmark(Report& report, const Settings&) {
  const std::string name = "linear 64-10";
  if (std::system("valgrind --version >/dev/null 2>&1") != 0) {
    report.row({"instructions", name, "skipped: valgrind is not installed", ""});
    return;
  }
  const auto dir = std::filesystem::temp_directory_path() / "fulgor-callgrind";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto out = dir / "callgrind.out";
  const std::string command = fmt::format(
      "OMP_NUM_THREADS=1 valgrind --tool=callgrind --zero-before=fulgor_bench_counted_run "
      "--dump-after=fulgor_bench_counted_run --toggle-collect=fulgor_bench_counted_run "
      "--callgrind-out-file={} /proc/{}/exe --instructions-child "
      ">{} 2>&1",
      out.string(), ::getpid(), (dir / "log").string());
  if (std::system(command.c_str()) != 0) {
    report.row({"instructions", name, "failed: see " + (dir / "log").string(), ""});
    return;
  }
  // Dumps are numbered in the order the child made them: per length, raw then each variant.
  const size_t per_length = 1 + counted_variants().size();
  auto dump = [&](size_t length, size_t side) {
    return instructions_in(out.string() + "." + std::to_string(length * per_length + side + 1));
  };
  auto per_step = [&](size_t side) {
    return static_cast<double>(dump(1, side) - dump(0, side)) / (kLongSteps - kShortSteps);
  };
  const double raw = per_step(0);
  report.row({"instructions", name + ", hand-written loop", fmt::format("{:.0f} instr/step", raw), ""});
  for (size_t i = 0; i < counted_variants().size(); ++i) {
    const double fulgor = per_step(i + 1);
    report.row({"instructions", name + ", " + counted_variants()[i].name, fmt::format("{:.0f} instr/step", fulgor),
                fmt::format("{:.3f}x, {:+.0f} instr/step", fulgor / raw, fulgor - raw)});
    report.figures["instructions_tiny_own" + std::string(i == 0 ? "_barebones" : "")] = fulgor - raw;
  }
  report.figures["instructions_tiny_raw"] = raw;
  std::filesystem::remove_all(dir);
}

}  // namespace fulgor::bench
