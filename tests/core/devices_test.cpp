#include <gtest/gtest.h>

#include "fulgor/core/devices.h"
#include "fulgor/core/error.h"

namespace fulgor {
namespace {

using Indices = std::vector<int64_t>;

Indices parse(const Devices& d, int64_t available = 4) { return parse_device_indices(d, available, "test"); }

std::string rejection(const Devices& d, int64_t available = 4) {
  try {
    parse(d, available);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Devices, AcceptsLightningForms) {
  EXPECT_EQ(parse("auto"), (Indices{0, 1, 2, 3}));
  EXPECT_EQ(parse(-1), (Indices{0, 1, 2, 3}));
  EXPECT_EQ(parse("-1"), (Indices{0, 1, 2, 3}));
  EXPECT_EQ(parse(2), (Indices{0, 1}));
  EXPECT_EQ(parse("3"), (Indices{0, 1, 2}));
  EXPECT_EQ(parse(" 2 "), (Indices{0, 1}));
  EXPECT_EQ(parse("0,1"), (Indices{0, 1}));
  EXPECT_EQ(parse("1,"), (Indices{1}));
  EXPECT_EQ(parse("3, 1"), (Indices{3, 1}));
  EXPECT_EQ(parse(std::vector<int>{0, 2}), (Indices{0, 2}));
  EXPECT_EQ(parse({2}), (Indices{2}));
  EXPECT_EQ(parse(Devices()), (Indices{0, 1, 2, 3}));
}

TEST(Devices, RejectsWithTheValueAndTheCount) {
  EXPECT_NE(rejection(0).find("devices=0"), std::string::npos);
  EXPECT_NE(rejection("0").find("devices=\"0\""), std::string::npos);
  EXPECT_NE(rejection(std::vector<int64_t>{}).find("empty"), std::string::npos);
  EXPECT_NE(rejection("0,0").find("index 0 appears twice"), std::string::npos);
  EXPECT_NE(rejection({1, 1}).find("appears twice"), std::string::npos);
  EXPECT_NE(rejection(-2).find("negative"), std::string::npos);
  EXPECT_NE(rejection({-1}).find("index -1 is negative"), std::string::npos);
  EXPECT_NE(rejection(5).find("5 devices requested but only 4 available"), std::string::npos);
  EXPECT_NE(rejection({4}).find("index 4 does not exist: 4 device(s) available"), std::string::npos);
  EXPECT_NE(rejection("1,x").find("'x' is not an integer"), std::string::npos);
  EXPECT_NE(rejection("two").find("accepted:"), std::string::npos);
  EXPECT_NE(rejection("auto", 0).find("no devices are available"), std::string::npos);
  EXPECT_NE(rejection(9).find("for accelerator 'test'"), std::string::npos);
}

TEST(Devices, ProcessCountsForTheCpu) {
  EXPECT_EQ(parse_process_count("auto", "cpu"), 1);
  EXPECT_EQ(parse_process_count(3, "cpu"), 3);
  EXPECT_EQ(parse_process_count("2", "cpu"), 2);
  EXPECT_THROW(parse_process_count(0, "cpu"), ConfigError);
  EXPECT_THROW(parse_process_count(-1, "cpu"), ConfigError);
  EXPECT_THROW(parse_process_count("0,1", "cpu"), ConfigError);
  EXPECT_THROW(parse_process_count({0, 1}, "cpu"), ConfigError);
}

// A count is checked against the limit before anything is allocated for it.
TEST(Devices, RefusesCountsAboveTheLimitNamingIt) {
  auto process_count_rejection = [](const Devices& d) {
    try {
      parse_process_count(d, "cpu");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string m = process_count_rejection(int64_t{100000000000});
  EXPECT_NE(m.find("devices=100000000000"), std::string::npos) << m;
  EXPECT_NE(m.find("65536"), std::string::npos) << m;
  m = process_count_rejection("9223372036854775807");
  EXPECT_NE(m.find("devices=\"9223372036854775807\""), std::string::npos) << m;
  EXPECT_NE(m.find("65536"), std::string::npos) << m;
  EXPECT_EQ(parse_process_count(65536, "cpu"), 65536);

  m = rejection(65537, 100000);
  EXPECT_NE(m.find("devices=65537"), std::string::npos) << m;
  EXPECT_NE(m.find("65536"), std::string::npos) << m;
  // "auto" on an accelerator that counts more devices than the limit.
  m = rejection("auto", 65537);
  EXPECT_NE(m.find("devices=auto"), std::string::npos) << m;
  EXPECT_NE(m.find("65537"), std::string::npos) << m;
  EXPECT_NE(m.find("65536"), std::string::npos) << m;
}

TEST(Devices, PrintsAsTyped) {
  EXPECT_EQ(Devices().str(), "auto");
  EXPECT_EQ(Devices(2).str(), "2");
  EXPECT_EQ(Devices("0,1").str(), "\"0,1\"");
  EXPECT_EQ(Devices({0, 2}).str(), "[0, 2]");
  EXPECT_EQ(Devices(2), Devices(int64_t{2}));
  EXPECT_NE(Devices(2), Devices("2"));
}

}  // namespace
}  // namespace fulgor
