#pragma once

#include "harness.h"

namespace fulgor::bench {

struct Settings {
  bool quick = false;  // smaller sizes and fewer repeats, to check the benchmarks run
  int repeats = 5;
  int processes = 7;  // fresh processes each model's overhead is measured in
};

void data_benchmark(Report& report, const Settings& settings);
void overhead_benchmark(Report& report, const Settings& settings);
void checkpoint_benchmark(Report& report, const Settings& settings);
void interop_benchmark(Report& report, const Settings& settings);
void instructions_benchmark(Report& report, const Settings& settings);
void precision_benchmark(Report& report, const Settings& settings);
/// The instructions benchmark's child mode, run under callgrind.
int instructions_child();
/// The overhead benchmark's child mode: prints one process's pairs of run times.
int overhead_child(const std::string& model, size_t variant, int repeats, bool quick);

}  // namespace fulgor::bench
