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

}  // namespace fulgor::bench
