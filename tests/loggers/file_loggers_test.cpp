// The file loggers: CSV and JSON lines, a version folder per run, with
// Lightning's step labels.

#include <fstream>
#include <string>
#include <vector>

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Loggers, CsvAndJsonLinesWriteVersionedRuns) {
  TempDir dir;
  auto train = sequential_loader(16, 4);
  auto val = sequential_loader(8, 4);
  for (int run = 0; run < 2; ++run) {
    TinyNet model;
    model.save_hyperparameters({{"hidden", 8}, {"run", run}});
    auto options = quiet(dir.str());
    options.max_epochs = 2;
    options.log_every_n_steps = 2;
    options.loggers = {std::make_shared<CSVLogger>(dir.str()),
                       std::make_shared<JsonLinesLogger>(FileLoggerOptions{.save_dir = dir.str(), .name = "jsonl"})};
    Trainer trainer(options);
    trainer.fit(model, train, val);
    EXPECT_EQ(trainer.log_dir(), (dir.path / "lightning_logs" / ("version_" + std::to_string(run))).string());
  }
  const fs::path run1 = dir.path / "lightning_logs" / "version_1";
  auto csv = lines_of(run1 / "metrics.csv");
  ASSERT_FALSE(csv.empty());
  EXPECT_EQ(csv[0], "step,epoch,train_loss,val_loss");
  // 8 training steps logged every 2, and one validation row per epoch.
  EXPECT_EQ(csv.size(), 1u + 4 + 2);
  std::ifstream hparams(run1 / "hparams.json");
  EXPECT_EQ(nlohmann::json::parse(hparams).at("run"), 1);
  auto jsonl = lines_of(dir.path / "jsonl" / "version_1" / "metrics.jsonl");
  ASSERT_EQ(jsonl.size(), 6u);
  // Lightning's labels: the steps taken before the batch that logged; each
  // epoch's validation runs after its last batch and shares its label.
  std::vector<int64_t> steps;
  for (const auto& line : jsonl) steps.push_back(nlohmann::json::parse(line).at("step"));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 3, 3, 5, 7, 7}));
  auto last = nlohmann::json::parse(jsonl.back());
  EXPECT_EQ(last.at("epoch"), 1);
  EXPECT_TRUE(last.contains("val_loss"));
}

}  // namespace
}  // namespace fulgor::testing
