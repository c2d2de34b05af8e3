// Instructions and cache misses per training step, counted by callgrind:
// wall time on a busy machine drifts, these counts do not. The benchmark
// starts this program again under `valgrind --tool=callgrind` in a child mode
// that runs the hand-written loop and the Trainer for two numbers of steps
// each; callgrind zeroes its counters before and dumps them after each counted
// run (its --zero-before/--dump-after options, so no valgrind header is
// needed) and counts only inside it (--toggle-collect: a thread LibTorch
// starts during the first run would otherwise add its start-up to that run's
// count). The difference between the two lengths cancels set-up and teardown,
// leaving the per-step cost.
//
// Note [Simulated caches]
// A small model's step is bound by fetching LibTorch's code (Note [The
// per-step path] in src/loops/training_epoch_loop.cpp), so the Trainer's instructions say little
// about its time; the cache lines it adds say more. callgrind simulates a
// first-level instruction cache and a last level, here of fixed sizes so that
// the counts do not depend on the machine: 32 KiB, 8-way, as most x86 cores
// have, and 512 KiB, 8-way, standing for one core's second level (AMD Zen 2 to
// 4). A real cache's replacement and the physical placement of pages differ,
// so the counts show the direction and size of a change, not a time.

#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "benchmarks.h"
#include "loops.h"
#include "models.h"

namespace fulgor::bench {
namespace {

constexpr int64_t kShortSteps = 20, kLongSteps = 120;

const std::vector<Variant>& counted_variants() {
  static const std::vector<Variant> variants = {{"barebones", false, 0, false},
                                                {"progress bar + log()", true, 1, false},
                                                {"profiler \"simple\"", false, 0, false, "32", "simple"}};
  return variants;
}

struct Counts {
  double instructions = 0, l1i_misses = 0, last_level_misses = 0;
};

// The totals callgrind wrote into one dump file, by the names of its "events:" line.
Counts counts_in(const std::filesystem::path& dump) {
  std::ifstream in(dump);
  std::string line;
  std::vector<std::string> events;
  while (std::getline(in, line)) {
    if (line.rfind("events: ", 0) == 0) {
      std::istringstream names(line.substr(8));
      for (std::string name; names >> name;) events.push_back(name);
    }
    for (const char* key : {"totals: ", "summary: "}) {
      if (line.rfind(key, 0) != 0) continue;
      std::istringstream values(line.substr(std::strlen(key)));
      std::map<std::string, double> total;
      for (const auto& name : events) values >> total[name];
      return {total["Ir"], total["I1mr"], total["ILmr"] + total["DLmr"] + total["DLmw"]};
    }
  }
  throw std::runtime_error("no totals in " + dump.string());
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
      "OMP_NUM_THREADS=1 valgrind --tool=callgrind --cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 "
      "--LL=524288,8,64 --zero-before=fulgor_bench_counted_run "
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
    return counts_in(out.string() + "." + std::to_string(length * per_length + side + 1));
  };
  auto per_step = [&](size_t side) {
    const Counts short_run = dump(0, side), long_run = dump(1, side);
    const double steps = kLongSteps - kShortSteps;
    return Counts{(long_run.instructions - short_run.instructions) / steps,
                  (long_run.l1i_misses - short_run.l1i_misses) / steps,
                  (long_run.last_level_misses - short_run.last_level_misses) / steps};
  };
  // Note [Simulated caches]
  auto misses = [](const Counts& c) {
    return fmt::format("{:.0f} L1i, {:.0f} L2 misses/step", c.l1i_misses, c.last_level_misses);
  };
  const Counts raw = per_step(0);
  report.row({"instructions", name + ", hand-written loop", fmt::format("{:.0f} instr/step", raw.instructions), ""});
  report.row({"caches", name + ", hand-written loop", misses(raw), ""});
  for (size_t i = 0; i < counted_variants().size(); ++i) {
    const Counts fulgor = per_step(i + 1);
    const std::string variant = counted_variants()[i].name;
    const std::string suffix = i == 0 ? "_barebones" : !counted_variants()[i].profiler.empty() ? "_profiler" : "";
    report.row({"instructions", name + ", " + variant, fmt::format("{:.0f} instr/step", fulgor.instructions),
                fmt::format("{:.3f}x, {:+.0f} instr/step", fulgor.instructions / raw.instructions,
                            fulgor.instructions - raw.instructions)});
    report.row({"caches", name + ", " + variant, misses(fulgor),
                fmt::format("{:+.0f} L1i, {:+.0f} L2", fulgor.l1i_misses - raw.l1i_misses,
                            fulgor.last_level_misses - raw.last_level_misses)});
    report.figures["instructions_tiny_own" + suffix] = fulgor.instructions - raw.instructions;
    report.figures["l1i_misses_tiny_own" + suffix] = fulgor.l1i_misses - raw.l1i_misses;
    report.figures["l2_misses_tiny_own" + suffix] = fulgor.last_level_misses - raw.last_level_misses;
  }
  report.figures["instructions_tiny_raw"] = raw.instructions;
  std::filesystem::remove_all(dir);
}

}  // namespace fulgor::bench
