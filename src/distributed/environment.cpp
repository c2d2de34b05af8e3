#include "fulgor/distributed/environment.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

#include "fulgor/core/error.h"

namespace fulgor {
namespace {

// A whole decimal number in [min, max]; anything else names the variable.
int64_t parse_integer(const std::string& name, const std::string& value, int64_t min, int64_t max) {
  const char* begin = value.c_str();
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(begin, &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE || parsed < min || parsed > max || value[0] == '+' ||
      value[0] == ' ')
    throw ConfigError(fmt::format("environment variable {}='{}' is not accepted: expected a whole number from {} to {}",
                                  name, value, min, max));
  return parsed;
}

class Variables {
 public:
  explicit Variables(const EnvironmentLookup& lookup) : lookup_(lookup) {}

  std::optional<std::string> get(const std::string& name) const { return lookup_(name); }
  bool has(const std::string& name) const { return get(name).has_value(); }

  std::string required(const std::string& name, const std::string& launcher) const {
    std::optional<std::string> value = get(name);
    if (!value)
      throw ConfigError(
          fmt::format("environment variable {} is not set, but {} set others of its variables; a {} "
                      "launch needs it",
                      name, launcher, launcher));
    return *value;
  }

  int64_t integer(const std::string& name, const std::string& launcher, int64_t min = 0,
                  int64_t max = INT32_MAX) const {
    return parse_integer(name, required(name, launcher), min, max);
  }

 private:
  const EnvironmentLookup& lookup_;
};

void check_less(const std::string& name, int64_t value, const std::string& bound_name, int64_t bound) {
  if (value >= bound)
    throw ConfigError(fmt::format("environment variable {}={} is not accepted: it must be less than {}={}", name, value,
                                  bound_name, bound));
}

void check_consistent(const DistributedEnvironment& env, const std::string& rank_var, const std::string& world_var,
                      const std::string& local_rank_var, const std::string& local_world_var) {
  check_less(rank_var, env.rank, world_var, env.world_size);
  check_less(local_rank_var, env.local_rank, local_world_var, env.local_world_size);
  if (env.local_world_size > env.world_size)
    throw ConfigError(
        fmt::format("environment variable {}={} is not accepted: a node cannot run more than the {}={} "
                    "processes of the whole job",
                    local_world_var, env.local_world_size, world_var, env.world_size));
}

DistributedEnvironment from_torchrun(const Variables& vars) {
  const std::string launcher = "torchrun";
  DistributedEnvironment env;
  env.source = launcher;
  env.world_size = vars.integer("WORLD_SIZE", launcher, 1);
  env.rank = vars.integer("RANK", launcher);
  env.local_rank = vars.integer("LOCAL_RANK", launcher);
  env.local_world_size = vars.has("LOCAL_WORLD_SIZE") ? vars.integer("LOCAL_WORLD_SIZE", launcher, 1) : env.world_size;
  env.master_addr = vars.required("MASTER_ADDR", launcher);
  if (env.master_addr.empty())
    throw ConfigError("environment variable MASTER_ADDR='' is not accepted: expected a host name or address");
  env.master_port = static_cast<int>(vars.integer("MASTER_PORT", launcher, 1, 65535));
  check_consistent(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  env.node_rank = vars.has("GROUP_RANK") ? vars.integer("GROUP_RANK", launcher) : env.rank / env.local_world_size;
  return env;
}

// SLURM_TASKS_PER_NODE reads like "2(x3),1": tasks on each node, in node order.
std::vector<int64_t> expand_tasks_per_node(const std::string& value) {
  std::vector<int64_t> counts;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    const std::string item = value.substr(start, comma - start);
    const size_t paren = item.find("(x");
    if (paren != std::string::npos && !item.empty() && item.back() == ')') {
      const int64_t count = parse_integer("SLURM_TASKS_PER_NODE", item.substr(0, paren), 1, INT32_MAX);
      const int64_t repeat =
          parse_integer("SLURM_TASKS_PER_NODE", item.substr(paren + 2, item.size() - paren - 3), 1, INT32_MAX);
      counts.insert(counts.end(), static_cast<size_t>(repeat), count);
    } else {
      try {
        counts.push_back(parse_integer("SLURM_TASKS_PER_NODE", item, 1, INT32_MAX));
      } catch (const ConfigError&) {
        throw ConfigError(
            fmt::format("environment variable SLURM_TASKS_PER_NODE='{}' is not accepted: expected "
                        "counts such as \"4\" or \"2(x3),1\"",
                        value));
      }
    }
    start = comma + 1;
  }
  return counts;
}

DistributedEnvironment from_slurm(const Variables& vars) {
  const std::string launcher = "SLURM";
  DistributedEnvironment env;
  env.source = "slurm";
  env.world_size = vars.integer("SLURM_NTASKS", launcher, 1);
  env.rank = vars.integer("SLURM_PROCID", launcher);
  env.local_rank = vars.integer("SLURM_LOCALID", launcher);
  env.node_rank = vars.has("SLURM_NODEID") ? vars.integer("SLURM_NODEID", launcher) : 0;
  if (vars.has("SLURM_NTASKS_PER_NODE")) {
    env.local_world_size = vars.integer("SLURM_NTASKS_PER_NODE", launcher, 1);
  } else if (vars.has("SLURM_TASKS_PER_NODE")) {
    const std::vector<int64_t> counts = expand_tasks_per_node(*vars.get("SLURM_TASKS_PER_NODE"));
    if (env.node_rank >= static_cast<int64_t>(counts.size()))
      throw ConfigError(
          fmt::format("environment variable SLURM_NODEID={} is not accepted: SLURM_TASKS_PER_NODE='{}' "
                      "describes only {} nodes",
                      env.node_rank, *vars.get("SLURM_TASKS_PER_NODE"), counts.size()));
    env.local_world_size = counts[static_cast<size_t>(env.node_rank)];
  } else {
    const std::string nodes_var = vars.has("SLURM_NNODES") ? "SLURM_NNODES" : "SLURM_JOB_NUM_NODES";
    const int64_t nodes = vars.has(nodes_var) ? vars.integer(nodes_var, launcher, 1) : 1;
    if (env.world_size % nodes != 0)
      throw ConfigError(
          fmt::format("environment variable SLURM_NTASKS={} is not accepted: it does not divide evenly "
                      "over {}={} nodes; set SLURM_NTASKS_PER_NODE",
                      env.world_size, nodes_var, nodes));
    env.local_world_size = env.world_size / nodes;
  }
  check_consistent(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
  if (!vars.has("SLURM_NODEID")) env.node_rank = env.rank / env.local_world_size;

  if (std::optional<std::string> addr = vars.get("MASTER_ADDR"); addr && !addr->empty()) {
    env.master_addr = *addr;
  } else {
    const std::string list_var = vars.has("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
    env.master_addr = expand_slurm_nodelist(vars.required(list_var, launcher)).front();
  }
  if (vars.has("MASTER_PORT")) {
    env.master_port = static_cast<int>(vars.integer("MASTER_PORT", launcher, 1, 65535));
  } else {
    // Every task of a job derives the same port, and jobs sharing a node likely differ.
    const int64_t job_id = vars.integer("SLURM_JOB_ID", launcher, 0, INT64_MAX);
    env.master_port = static_cast<int>(15000 + job_id % 20000);
  }
  return env;
}

bool slurm_launched(const Variables& vars) {
  if (!vars.has("SLURM_PROCID") || !vars.has("SLURM_NTASKS")) return false;
  // Inside `salloc` or an interactive `srun --pty bash`, the shell is a task of
  // its own, not one of the job's training processes.
  const std::optional<std::string> job_name = vars.get("SLURM_JOB_NAME");
  return !(job_name && (*job_name == "bash" || *job_name == "interactive"));
}

// Expands one host name with bracket groups; appends to `out`.
void expand_name(const std::string& name, const std::string& whole, std::vector<std::string>& out) {
  const size_t open = name.find('[');
  if (open == std::string::npos) {
    if (name.find(']') != std::string::npos)
      throw ConfigError(fmt::format("SLURM node list '{}' is not accepted: ']' without '['", whole));
    out.push_back(name);
    return;
  }
  const size_t close = name.find(']', open);
  if (close == std::string::npos)
    throw ConfigError(fmt::format("SLURM node list '{}' is not accepted: '[' without ']'", whole));
  const std::string prefix = name.substr(0, open);
  const std::string ranges = name.substr(open + 1, close - open - 1);
  const std::string rest = name.substr(close + 1);
  const auto bad_range = [&](const std::string& range) {
    return ConfigError(
        fmt::format("SLURM node list '{}' is not accepted: '{}' is not a number or an ascending range "
                    "such as 01-04",
                    whole, range));
  };
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    if (comma == std::string::npos) comma = ranges.size();
    const std::string range = ranges.substr(start, comma - start);
    const size_t dash = range.find('-');
    const std::string first = range.substr(0, dash);
    const std::string last = dash == std::string::npos ? first : range.substr(dash + 1);
    int64_t low = 0, high = 0;
    try {
      low = parse_integer("SLURM_JOB_NODELIST", first, 0, INT64_MAX);
      high = parse_integer("SLURM_JOB_NODELIST", last, 0, INT64_MAX);
    } catch (const ConfigError&) {
      throw bad_range(range);
    }
    if (high < low) throw bad_range(range);
    for (int64_t i = low; i <= high; ++i)
      expand_name(prefix + fmt::format("{:0{}}", i, first.size()) + rest, whole, out);
    start = comma + 1;
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist) {
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= nodelist.size(); ++i) {
    const char c = i < nodelist.size() ? nodelist[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1)
      throw ConfigError(
          fmt::format("SLURM node list '{}' is not accepted: brackets are unbalanced or nested", nodelist));
    if (c == ',' && depth == 0) {
      const std::string name = nodelist.substr(start, i - start);
      if (name.empty())
        throw ConfigError(fmt::format("SLURM node list '{}' is not accepted: it has an empty host name", nodelist));
      expand_name(name, nodelist, hosts);
      start = i + 1;
    }
  }
  if (depth != 0) throw ConfigError(fmt::format("SLURM node list '{}' is not accepted: '[' without ']'", nodelist));
  return hosts;
}

DistributedEnvironment detect_distributed_environment(const EnvironmentLookup& lookup) {
  Variables vars(lookup);
  if (vars.has("RANK") || vars.has("WORLD_SIZE") || vars.has("LOCAL_RANK")) return from_torchrun(vars);
  if (slurm_launched(vars)) return from_slurm(vars);
  return {};
}

DistributedEnvironment detect_distributed_environment() {
  return detect_distributed_environment([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  });
}

}  // namespace fulgor
