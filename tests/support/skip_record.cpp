// Linked into every GoogleTest executable: under ctest, a skipped test writes
// its reason where the summary at the end of the run reads it (Note [Skip
// reasons on the terminal] in tests/CMakeLists.txt), and a run whose every
// test skipped says so, for ctest to report the suite as skipped (Note [One
// ctest per test suite]).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

class SkipRecorder : public ::testing::EmptyTestEventListener {
 public:
  explicit SkipRecorder(std::filesystem::path folder) : folder_(std::move(folder)) {}

  void OnTestProgramEnd(const ::testing::UnitTest& tests) override {
    if (tests.test_to_run_count() > 0 && tests.skipped_test_count() == tests.test_to_run_count())
      std::printf("fulgor: every test of this run was skipped\n");
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult& result = *info.result();
    if (!result.Skipped()) return;
    const std::string name = ctest_name(info);
    std::string reason;
    for (int i = 0; i < result.total_part_count(); ++i)
      if (result.GetTestPartResult(i).skipped()) reason += result.GetTestPartResult(i).message();
    std::string file = name;
    std::replace(file.begin(), file.end(), '/', '_');
    std::filesystem::create_directories(folder_);
    std::ofstream(folder_ / file) << name << '\n' << (reason.empty() ? "(no reason given)" : reason) << '\n';
  }

 private:
  // The test's name, a value-parameterized test's index (Name/2) replaced by
  // its parameter (Name/"adam").
  static std::string ctest_name(const ::testing::TestInfo& info) {
    std::string test = info.name();
    if (info.value_param() != nullptr) test = test.substr(0, test.rfind('/') + 1) + info.value_param();
    return std::string(info.test_suite_name()) + "." + test;
  }

  std::filesystem::path folder_;
};

// Before main: the listener is in place before any test runs.
const bool kRegistered = [] {
  if (const char* folder = std::getenv("FULGOR_SKIP_RECORDS"); folder != nullptr && *folder != '\0')
    ::testing::UnitTest::GetInstance()->listeners().Append(new SkipRecorder(folder));
  return true;
}();

}  // namespace
