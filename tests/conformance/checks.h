#pragma once

// The checks of fulgor-conformance, run against one accelerator with the CPU
// as the reference. See docs/conformance.md for what each one means.

#include <functional>
#include <string>
#include <vector>

#include "fulgor/accelerator.h"
#include "fulgor/devices.h"

namespace fulgor::conformance {

/// How closely a device must reproduce the CPU's numbers, with
/// torch::allclose's meaning: |device - cpu| <= atol + rtol * |cpu|, element
/// by element. The defaults leave room for reduced-precision float32 math
/// (TF32 convolutions, fused kernels) but not for a wrong result.
struct Tolerance {
  double rtol = 1e-3;
  double atol = 1e-4;
};

struct Options {
  Devices devices = "auto";  ///< the devices the per-device checks run on
  Tolerance tolerance;
};

/// Collects PASS and FAIL lines. A check passes when it returns, optionally
/// with a note shown beside PASS, and fails with the first line of whatever
/// it throws.
class Report {
 public:
  void check(const std::string& name, const std::function<std::string()>& body);
  int passed() const { return passed_; }
  int failed() const { return failed_; }

 private:
  int passed_ = 0;
  int failed_ = 0;
};

/// Runs every check on `accelerator`; when it is unavailable, that is the one
/// failure reported.
void run_checks(Accelerator& accelerator, const Options& options, Report& report);

}  // namespace fulgor::conformance
