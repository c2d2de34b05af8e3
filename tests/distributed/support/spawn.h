#pragma once

// Temporary folders, ports and processes for the distributed tests.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../support/child_process.h"

namespace fulgor::test {

/// A fresh directory, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fulgor-ddp-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

/// A TCP port nothing listens on now (the kernel's choice for port 0).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw std::runtime_error("cannot find a free port");
  close(fd);
  return ntohs(address.sin_port);
}

#ifdef FULGOR_RUN_PATH
/// Runs `fulgor-run --nproc-per-node 2 -- worker args...` and returns its
/// wait status (nullopt when it overran `limit`) and its output.
inline std::pair<std::optional<int>, std::string> run_two_ranks(
    const std::string& worker, const std::vector<std::string>& worker_args, const std::string& log,
    std::chrono::seconds limit = std::chrono::seconds(120)) {
  std::vector<std::string> argv = {FULGOR_RUN_PATH, "--nproc-per-node", "2", "--", worker};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  Child launcher(argv, {}, log);
  std::optional<int> status = launcher.wait(limit);
  return {status, launcher.log()};
}

#ifdef FULGOR_DISTRIBUTED_WORKER
/// The same with the distributed layer's worker.
inline std::pair<std::optional<int>, std::string> run_two_ranks(
    const std::vector<std::string>& worker_args, const std::string& log,
    std::chrono::seconds limit = std::chrono::seconds(120)) {
  return run_two_ranks(FULGOR_DISTRIBUTED_WORKER, worker_args, log, limit);
}
#endif
#endif

/// Starts `argv` as the ranks of a job of `nodes` nodes of `per_node` ranks
/// each on loopback without fulgor-run (which would stop a survivor itself,
/// and mixes the ranks' output), numbered as torchrun numbers them (node k
/// holds ranks k * per_node to k * per_node + per_node - 1) or, `cyclic`, as
/// srun's cyclic distribution does (node k holds ranks k, k + nodes, ...);
/// rank R writes to dir/logR.
inline std::vector<std::unique_ptr<Child>> start_nodes(const std::vector<std::string>& argv, const std::string& dir,
                                                       int nodes, int per_node, bool cyclic = false) {
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Child>> ranks;
  for (int rank = 0; rank < nodes * per_node; ++rank) {
    const int node = cyclic ? rank % nodes : rank / per_node, local = cyclic ? rank / nodes : rank % per_node;
    ranks.push_back(
        std::make_unique<Child>(argv,
                                std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                                                   {"LOCAL_RANK", std::to_string(local)},
                                                                   {"WORLD_SIZE", std::to_string(nodes * per_node)},
                                                                   {"LOCAL_WORLD_SIZE", std::to_string(per_node)},
                                                                   {"GROUP_RANK", std::to_string(node)},
                                                                   {"MASTER_ADDR", "127.0.0.1"},
                                                                   {"MASTER_PORT", port}},
                                (std::filesystem::path(dir) / ("log" + std::to_string(rank))).string()));
  }
  return ranks;
}

/// Ranks 0 to n-1 of a job of one node (start_nodes).
inline std::vector<std::unique_ptr<Child>> start_ranks(const std::vector<std::string>& argv, const std::string& dir,
                                                       int n) {
  return start_nodes(argv, dir, 1, n);
}

inline std::vector<std::unique_ptr<Child>> start_two_ranks(const std::vector<std::string>& argv,
                                                           const std::string& dir) {
  return start_ranks(argv, dir, 2);
}

}  // namespace fulgor::test
