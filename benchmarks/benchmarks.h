#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness.h"

namespace fulgor::bench {

struct Settings {
  bool quick = false;  // smaller sizes and fewer repeats, to check the benchmarks run
  int repeats = 5;
  int processes = 7;  // fresh processes each model's overhead is measured in
  std::string device = "cuda";  // the accelerator the gpu benchmark runs on
  int gpu_repeats = 5;          // interleaved runs of each of its variants
  // The overhead benchmark's models ("linear", "mlp", "cnn") and variants
  // (their names in the table) to run; empty: all.
  std::vector<std::string> overhead_models, overhead_variants;
};

void data_benchmark(Report& report, const Settings& settings);
/// Run only when named (--only gpu).
void gpu_benchmark(Report& report, const Settings& settings);
void overhead_benchmark(Report& report, const Settings& settings);
void checkpoint_benchmark(Report& report, const Settings& settings);
void interop_benchmark(Report& report, const Settings& settings);
void instructions_benchmark(Report& report, const Settings& settings);
void precision_benchmark(Report& report, const Settings& settings);
void c_api_benchmark(Report& report, const Settings& settings);
void sharded_benchmark(Report& report, const Settings& settings);
/// The sharded benchmark's child mode: one rank, started by fulgor-run.
int sharded_child(const std::string& variant, int64_t width, int64_t steps, const std::string& out);
/// The checkpoint benchmark's rows of distributed checkpoints, and their
/// child mode: one rank, started by fulgor-run.
void distributed_checkpoint_rows(Report& report, const Settings& settings);
int distributed_checkpoint_child(int64_t width, int repeats, const std::string& out);
/// The instructions benchmark's child mode, run under callgrind.
int instructions_child();
/// The overhead benchmark's child mode: prints one process's pairs of run times.
int overhead_child(const std::string& model, size_t variant, int repeats, bool quick);

}  // namespace fulgor::bench
