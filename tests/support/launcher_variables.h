#pragma once

// A launcher's variables (torchrun's RANK, WORLD_SIZE, ...) for the scope of a test.

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace fulgor::test {

struct LauncherVariables {
  std::vector<std::string> names;
  explicit LauncherVariables(const std::map<std::string, std::string>& values) {
    for (const auto& [name, value] : values) {
      ::setenv(name.c_str(), value.c_str(), 1);
      names.push_back(name);
    }
  }
  ~LauncherVariables() {
    for (const auto& name : names) ::unsetenv(name.c_str());
  }
  LauncherVariables(const LauncherVariables&) = delete;
  LauncherVariables& operator=(const LauncherVariables&) = delete;
};

/// torchrun's variables for rank 0 of `world_size` processes on one node.
inline std::map<std::string, std::string> torchrun_rank_zero(int world_size) {
  const std::string world = std::to_string(world_size);
  return {{"RANK", "0"},
          {"LOCAL_RANK", "0"},
          {"WORLD_SIZE", world},
          {"LOCAL_WORLD_SIZE", world},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29533"}};
}

}  // namespace fulgor::test
