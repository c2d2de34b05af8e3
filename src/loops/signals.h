#pragma once

#include <csignal>

namespace fulgor::detail {

// The first signal caught since the trap was set, or 0; written by the
// handler only.
inline volatile std::sig_atomic_t g_signal_pending = 0;

// Note [Stopping on a signal]
// While a fit runs, SIGINT and SIGTERM are caught: the first only records the
// signal, and the loop saves a checkpoint and returns after the current batch;
// the second restores the default disposition and re-raises, which ends
// the process at once (the user pressed Ctrl-C twice, or the scheduler lost
// patience). A process that started the ranks of its job passes the first on
// to them (Note [The Trainer's own launcher]). Signal dispositions belong to
// the process, so this state exists once, here, and nested or concurrent fits
// share it.
class SignalTrap {
 public:
  SignalTrap();
  ~SignalTrap();
  SignalTrap(const SignalTrap&) = delete;
  SignalTrap& operator=(const SignalTrap&) = delete;
  // The first signal caught since the trap was set, or 0. Inline: the
  // training loop asks after every batch (Note [The per-step path]).
  static int pending() { return g_signal_pending; }
};

}  // namespace fulgor::detail
