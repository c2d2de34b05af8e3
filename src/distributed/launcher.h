#pragma once

#include <csignal>
#include <cstdint>
#include <string>

#include "fulgor/distributed/environment.h"

namespace fulgor::detail {

// Note [The Trainer's own launcher]
// Lightning's subprocess script launcher: a Trainer whose devices select N > 1
// devices in a process that no launcher started (no torchrun, fulgor-run or
// SLURM variables) runs the program again N-1 times, as ranks 1..N-1, with the
// variables fulgor-run sets, and becomes rank 0 itself (its own environment
// gets the same variables, so that later Trainers of the program join the same
// job). What differs from Lightning, and why:
//   - Each rank is started by a thread of its own that then waits for it, and
//     asks the kernel to kill the rank when that thread ends
//     (PR_SET_PDEATHSIG): the thread lives as long as the process, so a rank
//     never outlives rank 0, however rank 0 ends (Lightning's ranks can).
//   - A rank that fails is known the moment it ends, not within Lightning's
//     5-second poll; rank 0 names it on stderr and in the Trainer's error, and
//     the other ranks get SIGTERM, then SIGKILL after a grace period (Lightning
//     sends SIGKILL to every rank, rank 0 included, losing rank 0's checkpoint
//     on a signal and its error message).
//   - SIGTERM or SIGINT sent to rank 0 alone is passed on to every rank, so all
//     of them stop at the same batch and rank 0 saves its checkpoint (Note
//     [Stopping on a signal]); a terminal's Ctrl-C already reaches them all.
//   - When rank 0's program ends, it waits for the other ranks, and its exit
//     status becomes that of a rank that failed.

// Starts ranks 1..processes-1 of a job on this machine and returns rank 0's
// environment (also set in this process's variables). Throws DistributedError
// when the program cannot be run again. With FULGOR_MAX_RESTARTS above 0 it
// starts every rank, supervises them and exits with the job's status instead
// of returning (Note [Restarting the Trainer's own ranks] in the .cpp); a
// value that is not a whole number from 0 is a ConfigError naming it.
DistributedEnvironment launch_ranks(int64_t processes);

// Whether this process started ranks.
bool launched_ranks();

// The job's rendezvous is done: a rank that fails from now on makes rank 0's
// collectives fail; before, rank 0 ends at once with the rank's status.
void launched_ranks_joined();

// What the first rank that failed did ("rank 1 (pid 42) was killed by signal
// 9 (Killed)"), waiting up to `wait_seconds` for a failure to become known;
// empty when none failed.
std::string launched_rank_failure(double wait_seconds);

// Rank 0 cannot go on (its Trainer ended with an exception): the other ranks
// get SIGTERM, then SIGKILL after the grace period. Returns at once.
void stop_launched_ranks();

// Passes a signal sent to this process alone on to the ranks it started.
// Async-signal-safe: called from the signal handler.
void forward_signal_to_launched_ranks(int signal, const siginfo_t* info);

}  // namespace fulgor::detail
