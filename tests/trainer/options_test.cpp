// TrainerOptions to and from JSON and the command line.

#include <fstream>

#include "tiny.h"

namespace fulgor::testing {
namespace {

using nlohmann::json;

TrainerOptions unusual() {
  TrainerOptions o;
  o.accelerator = "xpu";
  o.strategy = "single_device";
  o.devices = std::vector<int64_t>{0, 2};
  o.logger = false;
  o.fast_dev_run = 2;
  o.max_epochs = 7;
  o.min_epochs = 2;
  o.max_steps = 100;
  o.limit_train_batches = 0.25;
  o.limit_val_batches = 3;
  o.limit_test_batches = 1;
  o.limit_predict_batches = 1.0;
  o.overfit_batches = 0.0;
  o.val_check_interval = 0.5;
  o.check_val_every_n_epoch = std::nullopt;
  o.num_sanity_val_steps = -1;
  o.log_every_n_steps = 5;
  o.enable_checkpointing = false;
  o.accumulate_grad_batches = 4;
  o.gradient_clip_val = 0.5;
  o.gradient_clip_algorithm = "value";
  o.deterministic = true;
  o.detect_anomaly = true;
  o.profiler = "simple";
  o.profiler_dirpath = "/tmp/profiles";
  o.profiler_filename = "perf";
  o.default_root_dir = "/tmp/runs";
  o.seed = 42;
  o.ddp_timeout = 90.5;
  return o;
}

TEST(TrainerOptionsJson, RoundTrips) {
  for (const TrainerOptions& original : {TrainerOptions{}, unusual()}) {
    json j = original;
    TrainerOptions back = j.get<TrainerOptions>();
    EXPECT_EQ(json(back), j);
    EXPECT_EQ(back.devices, original.devices);
    EXPECT_EQ(back.limit_train_batches, original.limit_train_batches);
    EXPECT_EQ(back.max_epochs, original.max_epochs);
    EXPECT_EQ(back.ddp_timeout, original.ddp_timeout);
  }
  // A count and a fraction of one stay apart.
  json j = unusual();
  EXPECT_TRUE(j["limit_test_batches"].is_number_integer());
  EXPECT_TRUE(j["limit_predict_batches"].is_number_float());
  EXPECT_TRUE(j["check_val_every_n_epoch"].is_null());
  EXPECT_EQ(j.size(), trainer_option_names().size());
}

TEST(TrainerOptionsJson, RejectsUnknownKeysAndIllTypedValues) {
  auto message = [](const json& j) {
    try {
      j.get<TrainerOptions>();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"max_epoch", 3}}).find("unknown trainer option 'max_epoch'"), std::string::npos);
  EXPECT_NE(message({{"max_epoch", 3}}).find("max_epochs"), std::string::npos);  // listed as known
  std::string m = message({{"max_epochs", "three"}});
  EXPECT_NE(m.find("'max_epochs'"), std::string::npos) << m;
  EXPECT_NE(m.find("expected an integer"), std::string::npos) << m;
  EXPECT_NE(message({{"enable_progress_bar", 1}}).find("expected a boolean"), std::string::npos);
  EXPECT_NE(message({{"limit_train_batches", "all"}}).find("'limit_train_batches'"), std::string::npos);
  EXPECT_NE(message({{"devices", {1.5}}}).find("'devices'"), std::string::npos);
  EXPECT_NE(message(json::array()).find("JSON object"), std::string::npos);
}

CommandLine parse(std::vector<std::string> args, TrainerOptions defaults = {}) {
  std::vector<const char*> argv = {"prog"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(), defaults);
}

TEST(TrainerOptionsCommandLine, FillsOptionsAndSections) {
  TempDir dir;
  const std::string config = (dir.path / "run.json").string();
  std::ofstream(config) << R"({"trainer": {"max_epochs": 9, "precision": 32}, "model": {"hidden": 16}})";
  auto cli =
      parse({"--config", config, "--trainer.max_epochs=3", "--trainer.accelerator", "xpu", "--trainer.devices=0,1",
             "--trainer.limit_train_batches=0.5", "--trainer.limit_val_batches=2", "--trainer.gradient_clip_val=null",
             "--trainer.seed=5", "--trainer.enable_progress_bar=false", "--model.lr=0.01", "--model.name=cnn"});
  EXPECT_EQ(cli.trainer.max_epochs, 3);  // later arguments win over the config file
  EXPECT_EQ(cli.trainer.precision, "32");
  EXPECT_EQ(cli.trainer.accelerator, "xpu");
  EXPECT_EQ(cli.trainer.devices, Devices("0,1"));
  EXPECT_EQ(cli.trainer.limit_train_batches, Limit(0.5));
  EXPECT_EQ(cli.trainer.limit_val_batches, Limit(2));
  EXPECT_FALSE(cli.trainer.gradient_clip_val.has_value());
  EXPECT_EQ(cli.trainer.seed, 5u);
  EXPECT_FALSE(cli.trainer.enable_progress_bar);
  EXPECT_EQ(cli.get<int>("model", "hidden", 0), 16);
  EXPECT_DOUBLE_EQ(cli.get<double>("model", "lr", 0), 0.01);
  EXPECT_EQ(cli.get<std::string>("model", "name", ""), "cnn");
  EXPECT_EQ(cli.get<int>("model", "missing", 4), 4);

  // Every option survives being written out as arguments and read back.
  json expected = unusual();
  std::vector<std::string> args;
  for (const auto& item : expected.items()) {
    std::string value = item.value().is_string() ? item.value().get<std::string>() : item.value().dump();
    args.push_back("--trainer." + item.key() + "=" + value);
  }
  EXPECT_EQ(json(parse(args).trainer), expected);
}

TEST(TrainerOptionsCommandLine, RejectsBadInputNamingTheKey) {
  auto message = [](std::vector<std::string> args) {
    try {
      parse(args);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message({"--trainer.max_epochs=many"});
  EXPECT_NE(m.find("max_epochs"), std::string::npos) << m;
  EXPECT_NE(m.find("expected an integer"), std::string::npos) << m;
  m = message({"--trainer.max_epoch=3"});
  EXPECT_NE(m.find("unknown trainer option 'max_epoch'"), std::string::npos) << m;
  EXPECT_NE(message({"--trainer.deterministic=maybe"}).find("expected a boolean"), std::string::npos);
  EXPECT_NE(message({"--trainer.max_epochs"}).find("needs a value"), std::string::npos);
  EXPECT_NE(message({"stray"}).find("unexpected argument 'stray'"), std::string::npos);
  EXPECT_NE(message({"--config", "/nonexistent/run.json"}).find("/nonexistent/run.json"), std::string::npos);
  EXPECT_TRUE(parse({"--help"}).help_requested);
  EXPECT_NE(command_line_help("prog").find("--trainer.max_epochs"), std::string::npos);
}

}  // namespace
}  // namespace fulgor::testing
