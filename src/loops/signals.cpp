#include "loops/signals.h"

#include "distributed/launcher.h"

#include <csignal>
#include <mutex>

namespace fulgor::detail {
namespace {

struct sigaction g_previous_int, g_previous_term;
std::mutex g_mutex;
int g_depth = 0;

extern "C" void on_signal(int signal, siginfo_t* info, void*) {
  if (g_signal_pending == 0) {
    g_signal_pending = signal;
    forward_signal_to_launched_ranks(signal, info);
    return;
  }
  // The default disposition, not the previous one, which may ignore the signal.
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

}  // namespace

SignalTrap::SignalTrap() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_depth++ > 0) return;
  g_signal_pending = 0;
  struct sigaction action {};
  action.sa_sigaction = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_SIGINFO;
  ::sigaction(SIGINT, &action, &g_previous_int);
  ::sigaction(SIGTERM, &action, &g_previous_term);
}

SignalTrap::~SignalTrap() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_depth > 0) return;
  ::sigaction(SIGINT, &g_previous_int, nullptr);
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
  g_signal_pending = 0;
}

}  // namespace fulgor::detail
