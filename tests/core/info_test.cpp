#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "fulgor/core/registry.h"
#include "fulgor/core/runtime_info.h"

namespace {

struct Outcome {
  int status;
  std::string output;  // stdout and stderr together
};

Outcome run_info(const std::string& arguments, const std::string& environment = "") {
  std::string command = environment + " " FULGOR_INFO_PATH " " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

bool has_row(const std::string& output, const std::string& row_pattern) {
  return std::regex_search(output, std::regex("(^|\n)" + row_pattern));
}

// A second registration of a name says where the first came from: here the
// environment variable, with the plugin's path.
TEST(FulgorInfo, ADuplicateNamesWhereTheFirstRegistrationCameFrom) {
  const auto copy = std::filesystem::temp_directory_path() / ("fulgor-info-vcpu-" + std::to_string(getpid()) + ".so");
  std::filesystem::copy_file(FULGOR_VCPU_PLUGIN, copy, std::filesystem::copy_options::overwrite_existing);
  Outcome run = run_info("--plugin " + copy.string(), "FULGOR_ACCELERATOR_PLUGINS=" FULGOR_VCPU_PLUGIN);
  std::filesystem::remove(copy);
  EXPECT_NE(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("accelerator plugin '" + copy.string() +
                            "' cannot be registered: accelerator 'vcpu' is already registered (by plugin '" +
                            FULGOR_VCPU_PLUGIN "', loaded from FULGOR_ACCELERATOR_PLUGINS)"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("load one of the two, or give one another name"), std::string::npos) << run.output;
}

TEST(FulgorInfo, ListsVersionsAndTheBuiltIns) {
  Outcome run = run_info("", "env -u FULGOR_ACCELERATOR_PLUGINS");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(has_row(run.output, R"(fulgor \d+\.\d+\.\d+ \(plugin ABI \d+\), LibTorch \d+\.\d+)")) << run.output;
  EXPECT_TRUE(has_row(run.output, R"(cpu +yes +1 +gloo +0 )")) << run.output;
  // Every supported LibTorch computes with a BLAS, loaded as a library of its
  // own (Debian's) or linked into LibTorch (PyTorch's own builds); the line names it.
  EXPECT_TRUE(has_row(run.output, R"(BLAS: (OpenBLAS|BLIS|MKL|ATLAS|reference BLAS) \((/.+|linked into LibTorch)\).*; )"
                                  R"(LibTorch threads: \d+)"))
      << run.output;
  // OpenBLAS also says how it runs its threads (Note [BLAS threads]).
  if (fulgor::blas_info().name == "OpenBLAS") {
    EXPECT_TRUE(has_row(run.output, R"(BLAS: OpenBLAS .*\((pthreads|OpenMP|sequential) build\); )")) << run.output;
  }
  // The CUDA row says what this machine has, and "auto" follows it.
  const auto cuda = fulgor::make_accelerator("cuda");
  if (cuda->is_available()) {
    EXPECT_TRUE(has_row(run.output, R"(cuda +yes +[1-9]\d* +nccl +400 )")) << run.output;
    EXPECT_TRUE(has_row(run.output, "auto selects: cuda")) << run.output;
  } else {
    const std::string reason =
        std::regex_replace(cuda->availability().reason, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
    EXPECT_TRUE(has_row(run.output, R"(cuda +no +0 +nccl +400 +)" + reason)) << run.output;
    EXPECT_TRUE(has_row(run.output, "auto selects: cpu")) << run.output;
  }
  EXPECT_TRUE(has_row(run.output, R"(xpu +no +0 +xccl +300 )")) << run.output;
  EXPECT_TRUE(has_row(run.output, R"(npu +no +0 +hccl +200 )")) << run.output;
}

TEST(FulgorInfo, ShowsPluginsFromTheCommandLineAndTheEnvironment) {
  Outcome flag = run_info("--plugin " FULGOR_VCPU_PLUGIN, "VCPU_DEVICE_COUNT=3");
  EXPECT_EQ(flag.status, 0) << flag.output;
  EXPECT_TRUE(has_row(flag.output, R"(vcpu +yes +3 +gloo +-10 +virtual devices)")) << flag.output;
  Outcome env = run_info("", "FULGOR_ACCELERATOR_PLUGINS=" FULGOR_VCPU_PLUGIN);
  EXPECT_EQ(env.status, 0) << env.output;
  EXPECT_TRUE(has_row(env.output, R"(vcpu +yes +2 )")) << env.output;
}

// A plugin named without a slash is found where the dynamic loader looks.
TEST(FulgorInfo, FindsABarePluginNameOnTheLoadersPath) {
  const std::filesystem::path plugin(FULGOR_VCPU_PLUGIN);
  Outcome run = run_info("--plugin " + plugin.filename().string(),
                         "LD_LIBRARY_PATH=" + plugin.parent_path().string() + " VCPU_DEVICE_COUNT=3");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(has_row(run.output, R"(vcpu +yes +3 )")) << run.output;
}

TEST(FulgorInfo, FailsWithTheErrorWhenAPluginDoesNotLoad) {
  Outcome bad = run_info("--plugin " FULGOR_ABI_MISMATCH_PLUGIN);
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("fulgor-info: accelerator plugin '" FULGOR_ABI_MISMATCH_PLUGIN "' was built for"),
            std::string::npos)
      << bad.output;
  Outcome env = run_info("", "FULGOR_ACCELERATOR_PLUGINS=/nonexistent.so");
  EXPECT_EQ(env.status, 1);
  EXPECT_NE(env.output.find("/nonexistent.so"), std::string::npos) << env.output;
  Outcome usage = run_info("--bogus");
  EXPECT_EQ(usage.status, 2);
  EXPECT_NE(usage.output.find("unknown argument '--bogus'"), std::string::npos) << usage.output;
}

}  // namespace
