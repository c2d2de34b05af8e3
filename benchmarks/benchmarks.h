#pragma once

#include "harness.h"

namespace fulgor::bench {

struct Settings {
  bool quick = false;  // smaller sizes and fewer repeats, to check the benchmarks run
  int repeats = 5;
};

void data_benchmark(Report& report, const Settings& settings);
void overhead_benchmark(Report& report, const Settings& settings);
void checkpoint_benchmark(Report& report, const Settings& settings);
void instructions_benchmark(Report& report, const Settings& settings);
void precision_benchmark(Report& report, const Settings& settings);
/// The instructions benchmark's child mode, run under callgrind.
int instructions_child();

}  // namespace fulgor::bench
