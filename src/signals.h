#pragma once

namespace fulgor::detail {

// Note [Stopping on a signal]
// While a fit runs, SIGINT and SIGTERM are caught: the first only records the
// signal, and the loop saves a checkpoint and returns after the current batch;
// the second restores the default disposition and re-raises, which ends
// the process at once (the user pressed Ctrl-C twice, or the scheduler lost
// patience). Signal dispositions belong to the process, so this state exists
// once, here, and nested or concurrent fits share it.
class SignalTrap {
 public:
  SignalTrap();
  ~SignalTrap();
  SignalTrap(const SignalTrap&) = delete;
  SignalTrap& operator=(const SignalTrap&) = delete;
  // The first signal caught since the trap was set, or 0.
  static int pending();
};

}  // namespace fulgor::detail
