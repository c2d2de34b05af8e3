#pragma once

// The checks of fulgor-conformance, run against one accelerator with the CPU
// as the reference. See docs/conformance.md for what each one means.

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fulgor/core/accelerator.h"
#include "fulgor/core/devices.h"

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
  /// This program's command line, which the check fit_at_defaults runs again.
  std::vector<std::string> command;
};

/// Why a check failed; anything else a check throws is reported as thrown.
class CheckFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& why) { throw CheckFailure(why); }

/// What a fit with the Trainer's defaults but the accelerator did, in one rank.
struct DefaultsFit {
  int64_t world_size = 1;
  bool global_zero = true;
  size_t steps = 0;
  double last_loss = 0;
};

/// Fits the conformance model with a Trainer at its defaults (devices and
/// strategy "auto") on `accelerator`: on several devices, the Trainer starts
/// the job's other ranks by running this program again.
DefaultsFit fit_at_defaults(const std::string& accelerator);
/// The optimizer steps each rank of that fit takes in a job of `world_size`.
int64_t steps_at_defaults(int64_t world_size);

/// The check fit_at_defaults: runs `command` again with --fit-at-defaults, in
/// a process of its own (the ranks it starts run the command too, and would
/// otherwise run every check again), and checks that it trained on every
/// device "auto" selects and reported once.
std::string check_fit_at_defaults(const Accelerator& accelerator, const std::vector<std::string>& command);

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
