#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

/// Where this process sits in a data-parallel job, as its launcher described it.
///
/// Contract:
///   - 0 <= rank < world_size, 0 <= local_rank < local_world_size <= world_size,
///     0 <= node_rank, 1 <= master_port <= 65535.
///   - A process started without a launcher is a job of one: rank 0 of 1 on
///     node 0, with source "single process".
struct FULGOR_API DistributedEnvironment {
  int64_t rank = 0;                       ///< global rank, 0 .. world_size-1
  int64_t local_rank = 0;                 ///< rank among the processes of this node
  int64_t world_size = 1;                 ///< processes in the job
  int64_t local_world_size = 1;           ///< processes on this node
  int64_t node_rank = 0;                  ///< index of this node
  std::string master_addr = "127.0.0.1";  ///< host of rank 0, which hosts the rendezvous store
  int master_port = 29500;                ///< port of the rendezvous store
  std::string source = "single process";  ///< "torchrun", "slurm" or "single process"

  bool is_distributed() const { return world_size > 1; }
};

/// Reads an environment variable: the value, or nullopt when unset.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// Detects the launch environment from the variables of, in this order:
///   torchrun / fulgor-run  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
///                          (required once any of RANK, WORLD_SIZE, LOCAL_RANK is
///                          set), LOCAL_WORLD_SIZE (default WORLD_SIZE), GROUP_RANK
///                          (default RANK / LOCAL_WORLD_SIZE)
///   SLURM (srun)           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, then
///                          SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE (or
///                          SLURM_NTASKS / SLURM_NNODES), SLURM_NODEID; MASTER_ADDR
///                          or the first host of SLURM_JOB_NODELIST; MASTER_PORT or
///                          15000 + SLURM_JOB_ID % 20000. An interactive allocation
///                          (SLURM_JOB_NAME "bash" or "interactive") is not a launch.
/// and otherwise returns the single-process environment. Throws ConfigError
/// naming the variable and its value when a value is not a number, out of range
/// or inconsistent with the others (e.g. RANK >= WORLD_SIZE).
FULGOR_API DistributedEnvironment detect_distributed_environment();
/// The same, reading variables through `lookup` (for tests and embedding).
FULGOR_API DistributedEnvironment detect_distributed_environment(const EnvironmentLookup& lookup);

/// Expands a SLURM host list such as "node[01-04,07],gpu5" into host names
/// ("node01", ..., "node04", "node07", "gpu5"), in order. Zero padding of a
/// range start is kept; several bracket groups in one name multiply
/// ("r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2). Throws ConfigError naming the
/// list for unbalanced brackets, empty names or descending ranges.
FULGOR_API std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

}  // namespace fulgor
