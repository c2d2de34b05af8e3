// TensorBoardLogger's event files, read back by an independent reader: the
// TFRecord framing and its CRCs are checked here from the format's definition,
// and the records are decoded by protoc against TensorBoard's field numbers
// (tensorboard_events.proto).

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <tuple>

#include <unistd.h>

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

// CRC-32C one bit at a time, from its definition: reflected polynomial
// 0x82F63B78, initial value and final xor 0xFFFFFFFF.
uint32_t crc32c_bitwise(const std::string& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

// TFRecord's masked CRC: rotated right by 15 bits, plus 0xa282ead8.
uint32_t masked_crc(const std::string& data) {
  const uint32_t crc = crc32c_bitwise(data);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

uint64_t little_endian(const std::string& bytes, size_t at, int n) {
  uint64_t value = 0;
  for (int i = n - 1; i >= 0; --i)
    value = (value << 8) | static_cast<unsigned char>(bytes[at + static_cast<size_t>(i)]);
  return value;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

struct Records {
  std::vector<std::string> data;
  int bad_crcs = 0;
  bool truncated = false;
};

// A TFRecord file: each record is an 8-byte length, its masked CRC, the data
// and the data's masked CRC, all little-endian.
Records split_records(const std::string& file) {
  Records records;
  size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 12) return records.truncated = true, records;
    const uint64_t length = little_endian(file, at, 8);
    if (little_endian(file, at + 8, 4) != masked_crc(file.substr(at, 8))) ++records.bad_crcs;
    if (file.size() - at - 12 < length + 4) return records.truncated = true, records;
    std::string data = file.substr(at + 12, length);
    if (little_endian(file, at + 12 + length, 4) != masked_crc(data)) ++records.bad_crcs;
    records.data.push_back(std::move(data));
    at += 16 + length;
  }
  return records;
}

struct Event {
  std::string text;  // protoc's text format, each run of white space made one space
  int64_t step = 0;
  std::string tag;
  std::optional<double> value;
};

// Decodes the records with protoc, as fields of one `Events` message.
std::vector<Event> decode(const std::vector<std::string>& records, const fs::path& scratch) {
  std::string events;
  for (const auto& data : records) {
    events.push_back('\x0A');  // field 1, length-delimited
    for (uint64_t n = data.size();; n >>= 7) {
      events.push_back(static_cast<char>((n & 0x7F) | (n >= 0x80 ? 0x80 : 0)));
      if (n < 0x80) break;
    }
    events += data;
  }
  const fs::path input = scratch / "events.bin";
  std::ofstream(input, std::ios::binary) << events;
  const std::string command = std::string("'") + FULGOR_PROTOC + "' --proto_path='" + FULGOR_TENSORBOARD_PROTO_DIR +
                              "' --decode=tensorboard.Events tensorboard_events.proto < '" + input.string() + "' 2>&1";
  std::string text;
  FILE* out = popen(command.c_str(), "r");
  if (!out) ADD_FAILURE() << "cannot run " << command;
  char buffer[4096];
  for (size_t n; out && (n = fread(buffer, 1, sizeof buffer, out)) > 0;) text.append(buffer, n);
  const int status = out ? pclose(out) : -1;
  EXPECT_EQ(status, 0) << command << ":\n" << text;

  std::vector<Event> decoded;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line == "event {") {
      decoded.emplace_back();
    } else if (!decoded.empty() && line != "}") {
      decoded.back().text += std::regex_replace(line, std::regex("^ +"), " ");
    }
  }
  for (auto& event : decoded) {
    std::smatch m;
    if (std::regex_search(event.text, m, std::regex("^ wall_time: \\S+ step: (-?\\d+)"))) event.step = std::stoll(m[1]);
    if (std::regex_search(event.text, m, std::regex("value \\{ tag: \"([^\"]*)\""))) event.tag = m[1];
    if (std::regex_search(event.text, m, std::regex("simple_value: (\\S+)"))) event.value = std::stod(m[1]);
  }
  return decoded;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<Event> events_in(const fs::path& file, const TempDir& scratch) {
  const Records records = split_records(read_file(file));
  EXPECT_EQ(records.bad_crcs, 0) << file;
  EXPECT_FALSE(records.truncated) << file;
  return decode(records.data, scratch.path);
}

const Event* first_with_tag(const std::vector<Event>& events, const std::string& tag) {
  for (const auto& event : events)
    if (event.tag == tag) return &event;
  return nullptr;
}

TEST(TensorBoardLogger, TheTestsCrcIsCrc32c) {
  // The check value of CRC-32C (RFC 3720, B.4).
  EXPECT_EQ(crc32c_bitwise("123456789"), 0xE3069283u);
}

TEST(TensorBoardLogger, WritesScalarsAndHparamsThatProtocDecodes) {
  TempDir dir;
  {
    TensorBoardLogger logger(dir.str());
    logger.log_hyperparams({{"lr", 0.001}, {"arch", "cnn"}, {"net", {{"hidden", 8}}}, {"shuffle", true}});
    logger.log_metrics({{"train_loss", 0.5}, {"epoch", 0}}, 3);
    logger.log_metrics({{"val_loss", 0.25}}, 7);
    logger.finalize("success");
  }
  const fs::path run = dir.path / "lightning_logs" / "version_0";
  const auto files = event_files(run);
  ASSERT_EQ(files.size(), 1u);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_TRUE(std::regex_match(files[0].filename().string(),
                               std::regex("events\\.out\\.tfevents\\.\\d{10}\\." + std::string(host) + "\\." +
                                          std::to_string(getpid()) + "\\.\\d+")))
      << files[0];

  const auto events = events_in(files[0], dir);
  ASSERT_EQ(events.size(), 1u + 1 + 3 + 3);
  EXPECT_NE(events[0].text.find("file_version: \"brain.Event:2\""), std::string::npos) << events[0].text;
  EXPECT_TRUE(std::regex_search(events[0].text, std::regex("wall_time: 1\\d{9}"))) << events[0].text;

  // Lightning logs hp_metric = -1 with the hyper-parameters, then the three
  // hparams plugin summaries, all without a step.
  ASSERT_EQ(events[1].tag, "hp_metric");
  EXPECT_EQ(events[1].value, -1.0);
  EXPECT_EQ(events[1].step, 0);
  const std::string plugin = "metadata { plugin_data { plugin_name: \"hparams\" content { ";
  EXPECT_EQ(events[2].tag, "_hparams_/experiment");
  EXPECT_NE(events[2].text.find(plugin + "experiment { "
                                         "hparam_infos { name: \"arch\" type: DATA_TYPE_STRING } "
                                         "hparam_infos { name: \"lr\" type: DATA_TYPE_FLOAT64 } "
                                         "hparam_infos { name: \"net/hidden\" type: DATA_TYPE_FLOAT64 } "
                                         "hparam_infos { name: \"shuffle\" type: DATA_TYPE_FLOAT64 } "
                                         "metric_infos { name { tag: \"hp_metric\" } } }"),
            std::string::npos)
      << events[2].text;
  EXPECT_EQ(events[3].tag, "_hparams_/session_start_info");
  EXPECT_NE(events[3].text.find(plugin + "session_start_info {"), std::string::npos) << events[3].text;
  for (const std::string hparam :
       {"key: \"arch\" value { string_value: \"cnn\" }", "key: \"lr\" value { number_value: 0.001 }",
        "key: \"net/hidden\" value { number_value: 8 }", "key: \"shuffle\" value { number_value: 1 }"})
    EXPECT_NE(events[3].text.find("hparams { " + hparam + " }"), std::string::npos) << events[3].text;
  EXPECT_EQ(events[4].tag, "_hparams_/session_end_info");
  EXPECT_NE(events[4].text.find(plugin + "session_end_info { status: STATUS_SUCCESS } }"), std::string::npos)
      << events[4].text;

  // One event per value, at its step.
  std::vector<std::tuple<std::string, int64_t, double>> scalars;
  for (size_t i = 5; i < events.size(); ++i)
    scalars.emplace_back(events[i].tag, events[i].step, events[i].value.value());
  EXPECT_EQ(scalars, (std::vector<std::tuple<std::string, int64_t, double>>{
                         {"epoch", 3, 0.0}, {"train_loss", 3, 0.5}, {"val_loss", 7, 0.25}}));
}

TEST(TensorBoardLogger, ACorruptedRecordFailsTheCrcCheck) {
  TempDir dir;
  TensorBoardLogger logger(dir.str());
  logger.log_metrics({{"loss", 1.5}}, 2);
  logger.save();
  std::string bytes = read_file(logger.event_file());
  ASSERT_EQ(split_records(bytes).bad_crcs, 0);
  ASSERT_EQ(split_records(bytes).data.size(), 2u);
  bytes[bytes.size() - 6] ^= 0x01;  // inside the last record's data
  EXPECT_EQ(split_records(bytes).bad_crcs, 1);
  bytes[3] ^= 0x01;  // the first record's length
  EXPECT_GE(split_records(bytes).bad_crcs, 1);
}

TEST(TensorBoardLogger, SavesHparamsYaml) {
  TempDir dir;
  TensorBoardLogger logger(dir.str());
  logger.log_hyperparams({{"lr", 1e-5},
                          {"arch", "cnn"},
                          {"note", "two words"},
                          {"layers", {64, 10}},
                          {"optimizer", {{"name", "adam"}, {"betas", {0.9, 0.999}}}},
                          {"seed", nullptr},
                          {"shuffle", false}});
  std::ifstream in(fs::path(logger.log_dir()) / "hparams.yaml");
  std::ostringstream text;
  text << in.rdbuf();
  // Floats keep a point (YAML 1.1 reads 1e-05 as text), as yaml.dump writes them.
  EXPECT_EQ(text.str(),
            "arch: cnn\n"
            "layers:\n"
            "- 64\n"
            "- 10\n"
            "lr: 1.0e-05\n"
            "note: \"two words\"\n"
            "optimizer:\n"
            "  betas:\n"
            "  - 0.9\n"
            "  - 0.999\n"
            "  name: adam\n"
            "seed: null\n"
            "shuffle: false\n");
}

TEST(TensorBoardLogger, WritesEventsOnlyEveryFlushSecs) {
  TempDir dir;
  TensorBoardLoggerOptions options;
  options.save_dir = dir.str();
  options.flush_secs = 3600;
  TensorBoardLogger logger(options);
  logger.log_metrics({{"loss", 1.0}}, 0);
  logger.log_metrics({{"loss", 0.5}}, 1);
  // The file version is written when the file is made; the values wait.
  EXPECT_EQ(split_records(read_file(logger.event_file())).data.size(), 1u);
  logger.save();
  EXPECT_EQ(split_records(read_file(logger.event_file())).data.size(), 3u);

  TempDir eager;
  options.save_dir = eager.str();
  options.flush_secs = 0;
  TensorBoardLogger every_time(options);
  every_time.log_metrics({{"loss", 1.0}}, 0);
  EXPECT_EQ(split_records(read_file(every_time.event_file())).data.size(), 2u);
}

TEST(TensorBoardLogger, LogsAfterFinalizeGoToANewFile) {
  TempDir dir;
  TensorBoardLogger logger(dir.str());
  logger.log_metrics({{"train_loss", 1.0}}, 0);
  logger.finalize("success");
  const std::string first = logger.event_file();
  logger.log_metrics({{"test_loss", 2.0}}, 0);
  logger.finalize("success");
  EXPECT_NE(logger.event_file(), first);
  EXPECT_EQ(event_files(logger.log_dir()).size(), 2u);
  const auto events = events_in(logger.event_file(), dir);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].tag, "test_loss");
}

TEST(TensorBoardLogger, IsTheTrainersDefaultLogger) {
  TempDir dir;
  auto train = sequential_loader(16, 4);
  auto val = sequential_loader(8, 4);
  TinyNet model;
  model.save_hyperparameters({{"hidden", 8}});
  auto options = quiet(dir, 2);
  options.logger = true;
  options.log_every_n_steps = 2;
  Trainer trainer(options);
  trainer.fit(model, train, val);
  const fs::path run = dir.path / "lightning_logs" / "version_0";
  EXPECT_EQ(trainer.log_dir(), run.string());
  EXPECT_FALSE(fs::exists(run / "metrics.csv"));
  EXPECT_TRUE(fs::exists(run / "hparams.yaml"));
  const auto files = event_files(run);
  ASSERT_EQ(files.size(), 1u);
  const auto events = events_in(files[0], dir);
  // The steps the CSV and JSON lines loggers get (Loggers.CsvAndJsonLinesWriteVersionedRuns).
  std::vector<int64_t> train_steps, val_steps;
  for (const auto& event : events) {
    if (event.tag == "train_loss") train_steps.push_back(event.step);
    if (event.tag == "val_loss") val_steps.push_back(event.step);
  }
  EXPECT_EQ(train_steps, (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(val_steps, (std::vector<int64_t>{3, 7}));
  ASSERT_NE(first_with_tag(events, "hp_metric"), nullptr);
  ASSERT_NE(first_with_tag(events, "_hparams_/session_start_info"), nullptr);
  EXPECT_NE(
      first_with_tag(events, "_hparams_/session_start_info")->text.find("key: \"hidden\" value { number_value: 8 }"),
      std::string::npos);
}

}  // namespace
}  // namespace fulgor::testing
