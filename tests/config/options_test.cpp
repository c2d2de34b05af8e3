// TrainerOptions to and from JSON and the command line.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>

#include "../support/tiny.h"

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
  o.use_distributed_sampler = false;
  o.async_checkpointing = true;
  o.num_nodes = 2;
  o.reload_dataloaders_every_n_epochs = 3;
  o.benchmark = false;
  o.inference_mode = false;
  o.barebones = true;
  o.sync_batchnorm = true;
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

CommandLine parse(std::vector<std::string> args, TrainerOptions defaults = {}, const json& sections = nullptr) {
  std::vector<const char*> argv = {"prog"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(), defaults, sections);
}

TEST(TrainerOptionsCommandLine, UseDistributedSamplerIsOnByDefault) {
  EXPECT_TRUE(TrainerOptions{}.use_distributed_sampler);
  EXPECT_EQ(json(TrainerOptions{})["use_distributed_sampler"], true);
  const json off = {{"use_distributed_sampler", false}};
  EXPECT_FALSE(off.get<TrainerOptions>().use_distributed_sampler);
  EXPECT_FALSE(parse({"--trainer.use_distributed_sampler=false"}).trainer.use_distributed_sampler);
  EXPECT_TRUE(parse({"--trainer.use_distributed_sampler=true"}, unusual()).trainer.use_distributed_sampler);
  try {
    parse({"--trainer.use_distributed_sampler=sometimes"});
    FAIL() << "a non-boolean was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use_distributed_sampler"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected a boolean"), std::string::npos) << e.what();
  }
  EXPECT_NE(command_line_help("prog", {}).find("use_distributed_sampler"), std::string::npos);
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

TEST(TrainerOptionsCommandLine, AnUnknownTrainerOptionNamesTheNearestOne) {
  auto message = [](const std::string& arg) {
    try {
      parse({arg});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("--trainer.acclerator=cpu"),
            "--trainer.acclerator: unknown trainer option 'acclerator'; did you mean 'accelerator'?");
  EXPECT_EQ(message("--trainer.max_epcohs=3"),  // two letters swapped: one edit
            "--trainer.max_epcohs: unknown trainer option 'max_epcohs'; did you mean 'max_epochs'?");
  // Nothing near: every option is listed.
  const std::string far = message("--trainer.learning_rate=0.1");
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
  EXPECT_NE(far.find("known: accelerator, "), std::string::npos) << far;
  // A config file's key too.
  TempDir dir;
  const std::string config = (dir.path / "run.json").string();
  std::ofstream(config) << R"({"trainer": {"devics": 2}})";
  EXPECT_EQ(message("--config=" + config),
            "--config " + config + ": unknown trainer option 'devics'; did you mean 'devices'?");
}

// A program that declares its sections has a typo in them refused as one in
// the trainer's, instead of silently running with the default.
TEST(TrainerOptionsCommandLine, DeclaredSectionsRefuseUnknownKeysNamingTheNearestOne) {
  const json sections = {{"model", {{"arch", "cnn"}, {"lr", 1e-3}}}, {"data", {{"batch_size", 128}}}};
  auto message = [&](std::vector<std::string> args) {
    try {
      parse(args, {}, sections);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({"--model.archh=mlp"}), "--model.archh: unknown model option 'archh'; did you mean 'arch'?");
  EXPECT_EQ(message({"--modle.arch=mlp"}), "--modle.arch: unknown section 'modle'; did you mean 'model'?");
  EXPECT_EQ(message({"--optimizer.lr=1"}), "--optimizer.lr: unknown section 'optimizer'; known: trainer, data, model");
  EXPECT_EQ(message({"--data.workers=4"}), "--data.workers: unknown data option 'workers'; known: batch_size");

  TempDir dir;
  const std::string config = (dir.path / "run.json").string();
  std::ofstream(config) << R"({"model": {"arch": "mlp", "lrr": 0.1}})";
  EXPECT_EQ(message({"--config", config}), "--config " + config + ": unknown model option 'lrr'; did you mean 'lr'?");
  std::ofstream(config) << R"({"data": 5})";
  EXPECT_NE(message({"--config", config}).find("section \"data\" must be an object of its keys"), std::string::npos);

  // Declared keys take values as before; their defaults are what get() finds.
  const CommandLine cli = parse({"--model.arch=mlp", "--data.batch_size=64"}, {}, sections);
  EXPECT_EQ(cli.get<std::string>("model", "arch", ""), "mlp");
  EXPECT_EQ(cli.get<int64_t>("data", "batch_size", 0), 64);
  EXPECT_DOUBLE_EQ(cli.get<double>("model", "lr", 0), 1e-3);
  const std::string help = command_line_help("prog", {}, sections);
  EXPECT_NE(help.find("--model.arch"), std::string::npos) << help;
  EXPECT_NE(help.find("[\"cnn\"]"), std::string::npos) << help;
  // Sections must be objects of keys, and "trainer" is the Trainer's.
  EXPECT_THROW(parse({}, {}, json{{"trainer", json::object()}}), ConfigError);
  EXPECT_THROW(parse({}, {}, json{{"model", 3}}), ConfigError);
  // Undeclared, every section is the program's to read, as before.
  EXPECT_EQ(parse({"--anything.at_all=1"}).get<int>("anything", "at_all", 0), 1);
}

std::string rejection(std::vector<std::string> args) {
  try {
    parse(args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

std::string config_rejection(const std::string& text) {
  TempDir dir;
  const std::string config = (dir.path / "run.json").string();
  std::ofstream(config) << text;
  return rejection({"--config", config});
}

// Integers of 2^63 and more once wrapped around: max_epochs=2^64-1 became -1
// (unlimited). Every option names the value as written instead.
TEST(TrainerOptionsJson, RefusesIntegersOutOfRangeNamingTheValueAsWritten) {
  struct Case {
    const char* config;
    const char* key;
    const char* value;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"trainer": {"max_epochs": 18446744073709551615}})", "max_epochs", "18446744073709551615"},
           {R"({"trainer": {"max_steps": 9223372036854775808}})", "max_steps", "9223372036854775808"},
           {R"({"trainer": {"max_steps": 100000000000000000000}})", "max_steps", "100000000000000000000"},
           {R"({"trainer": {"limit_train_batches": 18446744073709551615}})", "limit_train_batches",
            "18446744073709551615"},
           {R"({"trainer": {"devices": 18446744073709551615}})", "devices", "18446744073709551615"},
           {R"({"trainer": {"devices": [0, 18446744073709551615]}})", "devices", "18446744073709551615"},
           {R"({"trainer": {"precision": 18446744073709551615}})", "precision", "18446744073709551615"},
           {R"({"trainer": {"fast_dev_run": 18446744073709551615}})", "fast_dev_run", "18446744073709551615"},
           {R"({"model": {"layers": [1, -100000000000000000000]}})", "model.layers[1]", "-100000000000000000000"},
       }) {
    const std::string m = config_rejection(c.config);
    EXPECT_NE(m.find(c.key), std::string::npos) << c.config << ": " << m;
    EXPECT_NE(m.find(c.value), std::string::npos) << c.config << ": " << m;
  }
  // The largest values that fit are taken as they are.
  TempDir dir;
  const std::string config = (dir.path / "run.json").string();
  std::ofstream(config) << R"({"trainer": {"max_steps": 9223372036854775807, "seed": 4294967295}})";
  auto cli = parse({"--config", config});
  EXPECT_EQ(cli.trainer.max_steps, INT64_MAX);
  EXPECT_EQ(cli.trainer.seed, 4294967295u);
}

TEST(TrainerOptionsCommandLine, RefusesIntegersOutOfRangeNamingTheValueAsWritten) {
  for (const std::string value :
       {"18446744073709551615", "9223372036854775808", "-9223372036854775809", "100000000000000000000"}) {
    std::string m = rejection({"--trainer.max_epochs=" + value});
    EXPECT_NE(m.find("max_epochs"), std::string::npos) << m;
    EXPECT_NE(m.find(value), std::string::npos) << m;
    m = rejection({"--trainer.limit_val_batches=" + value});
    EXPECT_NE(m.find("limit_val_batches"), std::string::npos) << m;
    EXPECT_NE(m.find(value), std::string::npos) << m;
  }
  std::string m = rejection({"--model.width=100000000000000000000"});
  EXPECT_NE(m.find("--model.width"), std::string::npos) << m;
  EXPECT_NE(m.find("100000000000000000000"), std::string::npos) << m;
  EXPECT_EQ(parse({"--trainer.seed=4294967295"}).trainer.seed, 4294967295u);
}

// A program's own sections are read with the same care: no wrapping into a
// narrower integer, no raw nlohmann error.
TEST(TrainerOptionsCommandLine, GetRefusesValuesOfAnotherTypeOrOutOfRange) {
  auto cli = parse({"--model.hidden=1099511627776", "--model.name=cnn", "--model.rate=0.5", "--model.layers=-3"});
  auto message = [&](auto read) {
    try {
      read();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string m = message([&] { return cli.get<int>("model", "hidden", 0); });
  EXPECT_NE(m.find("--model.hidden"), std::string::npos) << m;
  EXPECT_NE(m.find("1099511627776"), std::string::npos) << m;
  EXPECT_EQ(cli.get<int64_t>("model", "hidden", 0), 1099511627776);
  m = message([&] { return cli.get<int>("model", "name", 0); });
  EXPECT_NE(m.find("--model.name"), std::string::npos) << m;
  m = message([&] { return cli.get<int>("model", "rate", 0); });
  EXPECT_NE(m.find("--model.rate"), std::string::npos) << m;
  m = message([&] { return cli.get<uint32_t>("model", "layers", 0); });
  EXPECT_NE(m.find("--model.layers"), std::string::npos) << m;
  m = message([&] { return cli.get<std::string>("model", "hidden", ""); });
  EXPECT_NE(m.find("--model.hidden"), std::string::npos) << m;
  EXPECT_DOUBLE_EQ(cli.get<double>("model", "hidden", 0), 1099511627776.0);
}

// A config nested 100,000 deep once overflowed the stack.
TEST(TrainerOptionsJson, RefusesDeepNesting) {
  const int depth = 100000;
  std::string m = config_rejection("{\"model\": " + std::string(depth, '[') + std::string(depth, ']') + "}");
  EXPECT_NE(m.find("run.json"), std::string::npos) << m;
  EXPECT_NE(m.find("nested deeper than"), std::string::npos) << m;
  std::string nested;
  for (int i = 0; i < depth; ++i) nested += "{\"a\": ";
  nested += "1" + std::string(depth, '}');
  m = config_rejection(nested);
  EXPECT_NE(m.find("nested deeper than"), std::string::npos) << m;
  m = rejection({"--model.x=" + std::string(depth, '[') + std::string(depth, ']')});
  EXPECT_NE(m.find("--model.x"), std::string::npos) << m;
  EXPECT_NE(m.find("nested deeper than"), std::string::npos) << m;
  m = rejection({"--trainer.devices=" + std::string(depth, '[') + std::string(depth, ']')});
  EXPECT_NE(m.find("devices"), std::string::npos) << m;
  EXPECT_NE(m.find("nested deeper than"), std::string::npos) << m;
  // Nesting as a config may need is read.
  std::string ten = std::string(10, '[') + std::string(10, ']');
  EXPECT_EQ(parse({"--model.x=" + ten}).sections["model"]["x"].dump(), ten);
}

TEST(TrainerOptionsCommandLine, NamesAFolderGivenAsConfig) {
  TempDir dir;
  const std::string m = rejection({"--config", dir.str()});
  EXPECT_NE(m.find("--config " + dir.str()), std::string::npos) << m;
  EXPECT_NE(m.find("folder"), std::string::npos) << m;
}

// A FIFO as --config once waited for a writer forever; a device read on.
TEST(TrainerOptionsCommandLine, RefusesAFifoOrADeviceAsConfigWithoutWaiting) {
  TempDir dir;
  const std::string fifo = (dir.path / "run.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto refused = std::async(std::launch::async, [&] { return rejection({"--config", fifo}); });
  if (refused.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "reading the FIFO " << fifo << " waits for a writer";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // the writer, so that the test ends
    if (fd >= 0) ::close(fd);
  }
  const std::string m = refused.get();
  EXPECT_NE(m.find("--config " + fifo + ": is a FIFO, not a regular file"), std::string::npos) << m;
  const std::string zero = rejection({"--config", "/dev/zero"});
  EXPECT_NE(zero.find("--config /dev/zero: is a character device, not a regular file"), std::string::npos) << zero;
}

// Invalid UTF-8 once let nlohmann's type_error.316 escape.
TEST(TrainerOptionsCommandLine, RefusesInvalidUtf8NamingTheOption) {
  std::string m = rejection({"--trainer.max_epochs=\xff"});
  EXPECT_NE(m.find("--trainer.max_epochs"), std::string::npos) << m;
  EXPECT_NE(m.find("UTF-8"), std::string::npos) << m;
  m = rejection({"--trainer.accelerator=cp\xc3"});
  EXPECT_NE(m.find("--trainer.accelerator"), std::string::npos) << m;
  m = rejection({"--model.name", "\xfe\xff"});
  EXPECT_NE(m.find("--model.name"), std::string::npos) << m;
  EXPECT_NE(m.find("UTF-8"), std::string::npos) << m;
  m = rejection({"--model.\xff=1"});
  EXPECT_NE(m.find("UTF-8"), std::string::npos) << m;
  // In a config file it is not JSON.
  m = config_rejection("{\"model\": {\"name\": \"\xff\"}}");
  EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
  EXPECT_EQ(parse({"--model.name=caf\xc3\xa9"}).get<std::string>("model", "name", ""), "caf\xc3\xa9");
}

// limit_train_batches=nan once trained no batch and reported success.
TEST(TrainerOptions, RefusesNanAndInfinityInEveryFloatingOption) {
  TempDir dir;
  auto loader = sequential_loader(8, 4);
  for (const std::string option :
       {"limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches", "overfit_batches",
        "val_check_interval", "gradient_clip_val", "ddp_timeout"}) {
    for (const std::string value : {"nan", "inf", "-inf"}) {
      TrainerOptions options = quiet(dir, 1);
      set_option(options, option, value);
      TinyNet model;
      Trainer trainer(options);
      try {
        trainer.fit(model, loader);
        ADD_FAILURE() << option << "=" << value << " accepted";
      } catch (const ConfigError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(option + "="), std::string::npos) << m;
        EXPECT_NE(m.find(value), std::string::npos) << m;
      }
    }
  }
}

TEST(TrainerOptions, CheckOptionsNamesTheOption) {
  TrainerOptions options;
  check_options(options);
  options.gradient_clip_val = std::numeric_limits<double>::quiet_NaN();
  try {
    check_options(options);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_clip_val=nan"), std::string::npos) << e.what();
  }
  options = {};
  options.max_epochs = -2;
  EXPECT_THROW(check_options(options), ConfigError);
}

// nlohmann keeps the last of repeated keys: a config that set max_epochs twice
// ran with the second, silently.
TEST(TrainerOptionsJson, RefusesAKeyGivenTwiceNamingTheKeyAndTheFile) {
  TempDir dir;
  const std::string config = (dir.path / "twice.json").string();
  for (const std::string& text : {std::string(R"({"trainer": {"max_epochs": 3, "max_epochs": 5}})"),
                                  std::string(R"({"model": {"hidden": 8}, "model": {"hidden": 9}})")}) {
    std::ofstream(config) << text;
    const std::string m = rejection({"--config", config});
    EXPECT_NE(m.find(config), std::string::npos) << m;
    EXPECT_NE(m.find(text.find("max_epochs") != std::string::npos ? "\"max_epochs\"" : "\"model\""), std::string::npos)
        << m;
    EXPECT_NE(m.find("twice"), std::string::npos) << m;
  }
  // The same key in two objects is no repetition.
  std::ofstream(config) << R"({"trainer": {"max_epochs": 3}, "model": {"max_epochs": 4}})";
  EXPECT_EQ(parse({"--config", config}).trainer.max_epochs, 3);
  const std::string m = rejection({R"(--model.layer={"width": 1, "width": 2})"});
  EXPECT_NE(m.find("\"width\" appears twice"), std::string::npos) << m;
}

// Lightning's seed_everything raises ValueError outside 0 to 2^32 - 1.
TEST(TrainerOptions, RefusesSeedsOutsideLightningsRange) {
  for (const std::string value : {"4294967296", "18446744073709551615"}) {
    const std::string m = rejection({"--trainer.seed=" + value});
    EXPECT_NE(m.find("seed"), std::string::npos) << m;
    EXPECT_NE(m.find(value), std::string::npos) << m;
    EXPECT_NE(m.find("4294967295"), std::string::npos) << m;
  }
  TrainerOptions options;
  options.seed = uint64_t{1} << 32;
  try {
    check_options(options);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("seed=4294967296"), std::string::npos) << e.what();
  }
  EXPECT_THROW(seed_everything(uint64_t{1} << 32), ConfigError);
  options.seed = kMaxSeed;
  check_options(options);
  EXPECT_EQ(seed_everything(kMaxSeed), kMaxSeed);
}

// run_main: what a program's main returns, and prints, when its body throws.
int run_main_capturing(std::string& err, const std::function<int()>& body) {
  const char* argv[] = {"/opt/bin/train", "--model.hiden=64", nullptr};
  ::testing::internal::CaptureStderr();
  const int status = run_main(2, argv, body);
  err = ::testing::internal::GetCapturedStderr();
  return status;
}

TEST(RunMain, ACommandLineErrorPrintsTheMessageAndReturns2) {
  const char* argv[] = {"/opt/bin/train", "--model.hiden=64", nullptr};
  const json sections = {{"model", {{"hidden", 128}}}};
  std::string err;
  EXPECT_EQ(run_main_capturing(err,
                               [&] {
                                 parse_command_line(2, argv, {}, sections);
                                 return 0;
                               }),
            2);
  EXPECT_EQ(err, "train: --model.hiden: unknown model option 'hiden'; did you mean 'hidden'?\n");
}

TEST(RunMain, AnotherErrorPrintsTheMessageAndReturns1) {
  std::string err;
  EXPECT_EQ(run_main_capturing(err, []() -> int { throw CheckpointError("last.ckpt: truncated"); }), 1);
  EXPECT_EQ(err, "train: last.ckpt: truncated\n");
  EXPECT_EQ(run_main_capturing(err, [] { return torch::ones({2}).view({3}).size(0) > 0 ? 0 : 5; }), 1);
  EXPECT_NE(err.find("train: "), std::string::npos) << err;
}

TEST(RunMain, ReturnsWhatTheBodyReturnsAndZeroForVoid) {
  const char* argv[] = {"train", nullptr};
  EXPECT_EQ(run_main(1, argv, [] { return 3; }), 3);
  bool ran = false;
  EXPECT_EQ(run_main(1, argv, [&] { ran = true; }), 0);
  EXPECT_TRUE(ran);
  EXPECT_EQ(run_main(0, argv, [] { return 0; }), 0);
  EXPECT_THROW(run_main(1, argv, [] { throw 42; }), int);  // not a std::exception: passed on
}

}  // namespace
}  // namespace fulgor::testing
