#include "fulgor/distributed/environment.h"

#include <gtest/gtest.h>

#include <map>

#include "fulgor/core/error.h"

namespace {

using Vars = std::map<std::string, std::string>;

fulgor::DistributedEnvironment detect(const Vars& vars) {
  return fulgor::detect_distributed_environment([&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

// The message of the ConfigError `vars` cause, or "" when none is thrown.
std::string error_of(const Vars& vars) {
  try {
    detect(vars);
  } catch (const fulgor::ConfigError& e) {
    return e.what();
  }
  return "";
}

const Vars kTorchrun = {{"RANK", "5"},
                        {"LOCAL_RANK", "1"},
                        {"WORLD_SIZE", "8"},
                        {"LOCAL_WORLD_SIZE", "4"},
                        {"MASTER_ADDR", "node01"},
                        {"MASTER_PORT", "29400"}};

TEST(DistributedEnvironment, NoLauncherIsOneProcess) {
  const auto env = detect({{"PATH", "/usr/bin"}});
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.rank, 0);
  EXPECT_FALSE(env.is_distributed());
  EXPECT_EQ(env.source, "single process");
}

TEST(DistributedEnvironment, ReadsTorchrunVariables) {
  const auto env = detect(kTorchrun);
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);  // derived: 5 / 4
  EXPECT_EQ(env.master_addr, "node01");
  EXPECT_EQ(env.master_port, 29400);
  EXPECT_TRUE(env.is_distributed());
}

TEST(DistributedEnvironment, TorchrunGroupRankAndDefaults) {
  Vars vars = kTorchrun;
  vars.erase("LOCAL_WORLD_SIZE");
  vars["GROUP_RANK"] = "3";
  const auto env = detect(vars);
  EXPECT_EQ(env.local_world_size, 8);
  EXPECT_EQ(env.node_rank, 3);
}

TEST(DistributedEnvironment, TorchrunWinsOverSlurm) {
  Vars vars = kTorchrun;
  vars["SLURM_PROCID"] = "0";
  vars["SLURM_NTASKS"] = "2";
  EXPECT_EQ(detect(vars).source, "torchrun");
}

TEST(DistributedEnvironment, TorchrunErrorsNameVariableAndValue) {
  Vars vars = kTorchrun;
  vars["RANK"] = "8";
  std::string message = error_of(vars);
  EXPECT_NE(message.find("RANK=8"), std::string::npos) << message;
  EXPECT_NE(message.find("WORLD_SIZE=8"), std::string::npos) << message;

  vars = kTorchrun;
  vars["WORLD_SIZE"] = "eight";
  message = error_of(vars);
  EXPECT_NE(message.find("WORLD_SIZE='eight'"), std::string::npos) << message;

  vars = kTorchrun;
  vars["MASTER_PORT"] = "70000";
  message = error_of(vars);
  EXPECT_NE(message.find("MASTER_PORT='70000'"), std::string::npos) << message;

  vars = kTorchrun;
  vars["LOCAL_RANK"] = "4";
  message = error_of(vars);
  EXPECT_NE(message.find("LOCAL_RANK=4"), std::string::npos) << message;

  vars = kTorchrun;
  vars["RANK"] = "-1";
  message = error_of(vars);
  EXPECT_NE(message.find("RANK='-1'"), std::string::npos) << message;

  vars = kTorchrun;
  vars.erase("MASTER_ADDR");
  message = error_of(vars);
  EXPECT_NE(message.find("MASTER_ADDR"), std::string::npos) << message;
}

const Vars kSlurm = {{"SLURM_PROCID", "6"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "2"},
                     {"SLURM_NTASKS_PER_NODE", "4"},
                     {"SLURM_NODEID", "1"},
                     {"SLURM_JOB_ID", "123456"},
                     {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                     {"SLURM_JOB_NAME", "train"}};

TEST(DistributedEnvironment, ReadsSlurmVariables) {
  const auto env = detect(kSlurm);
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "gpu07");
  EXPECT_EQ(env.master_port, 15000 + 123456 % 20000);
}

TEST(DistributedEnvironment, SlurmMasterFromEnvironmentWins) {
  Vars vars = kSlurm;
  vars["MASTER_ADDR"] = "head";
  vars["MASTER_PORT"] = "1234";
  const auto env = detect(vars);
  EXPECT_EQ(env.master_addr, "head");
  EXPECT_EQ(env.master_port, 1234);
}

TEST(DistributedEnvironment, SlurmTasksPerNodeDerived) {
  Vars vars = kSlurm;
  vars.erase("SLURM_NTASKS_PER_NODE");
  vars["SLURM_TASKS_PER_NODE"] = "2(x2),4";
  vars["SLURM_NTASKS"] = "8";
  vars["SLURM_NODEID"] = "2";
  vars["SLURM_LOCALID"] = "3";
  EXPECT_EQ(detect(vars).local_world_size, 4);

  vars.erase("SLURM_TASKS_PER_NODE");
  vars["SLURM_NNODES"] = "2";
  vars["SLURM_NODEID"] = "1";
  EXPECT_EQ(detect(vars).local_world_size, 4);

  vars["SLURM_NNODES"] = "3";
  const std::string message = error_of(vars);
  EXPECT_NE(message.find("SLURM_NTASKS=8"), std::string::npos) << message;
}

TEST(DistributedEnvironment, SlurmInteractiveShellIsNotALaunch) {
  Vars vars = kSlurm;
  vars["SLURM_JOB_NAME"] = "bash";
  EXPECT_EQ(detect(vars).source, "single process");
}

TEST(DistributedEnvironment, SlurmErrors) {
  Vars vars = kSlurm;
  vars["SLURM_PROCID"] = "8";
  std::string message = error_of(vars);
  EXPECT_NE(message.find("SLURM_PROCID=8"), std::string::npos) << message;

  vars = kSlurm;
  vars["SLURM_LOCALID"] = "x";
  message = error_of(vars);
  EXPECT_NE(message.find("SLURM_LOCALID='x'"), std::string::npos) << message;

  vars = kSlurm;
  vars["SLURM_JOB_NODELIST"] = "gpu[07-08";
  message = error_of(vars);
  EXPECT_NE(message.find("gpu[07-08"), std::string::npos) << message;
}

TEST(SlurmNodelist, ExpandsRangesListsAndPadding) {
  using V = std::vector<std::string>;
  EXPECT_EQ(fulgor::expand_slurm_nodelist("node[01-04,07],gpu5"),
            (V{"node01", "node02", "node03", "node04", "node07", "gpu5"}));
  EXPECT_EQ(fulgor::expand_slurm_nodelist("single"), (V{"single"}));
  EXPECT_EQ(fulgor::expand_slurm_nodelist("n[8-11]"), (V{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(fulgor::expand_slurm_nodelist("a[1-2]b[3,5],c"), (V{"a1b3", "a1b5", "a2b3", "a2b5", "c"}));
  EXPECT_EQ(fulgor::expand_slurm_nodelist("x[098-100]-ib"), (V{"x098-ib", "x099-ib", "x100-ib"}));
}

TEST(SlurmNodelist, RejectsMalformedLists) {
  for (const char* bad : {"node[1-2", "node1-2]", "node[4-2]", "node[a-b]", "a,,b", "node[[1]]", ""})
    EXPECT_THROW(fulgor::expand_slurm_nodelist(bad), fulgor::ConfigError) << bad;
}

}  // namespace
