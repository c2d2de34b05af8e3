// Checkpoint files, read as the Trainer resumes from them.
//
// An input that starts with "FULGORCK" is a whole checkpoint file, whose
// header, length and checksums are checked before LibTorch parses it. Any
// other input is the metadata JSON of a checkpoint that is otherwise valid:
// the Trainer writes one with its metadata replaced by the input, so that
// what reads the metadata is fuzzed behind the checksum.

#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "fulgor/fulgor.h"
#include "fuzz.h"
#include "config/json_input.h"

namespace fulgor::fuzz {
namespace {

namespace fs = std::filesystem;

// The metadata that replaces what the Trainer writes, when set.
std::optional<nlohmann::json> replacement;
nlohmann::json* metadata_being_saved = nullptr;

// One parameter: a line through the origin.
struct Slope : Module {
  torch::Tensor w;
  Slope() { w = register_parameter("w", torch::zeros({1})); }
  // The module's hook is the last to see a checkpoint being saved (Lightning's
  // order), so the replacement goes in here, into the metadata the callback
  // below found; `state` is not touched afterwards.
  void on_save_checkpoint(nlohmann::json& /*state*/) override {
    if (replacement && metadata_being_saved) *metadata_being_saved = *replacement;
    metadata_being_saved = nullptr;
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    auto loss = (w * batch.data - batch.target).pow(2).mean();
    log("loss", loss);
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    auto sgd = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    SchedulerConfig scheduler;
    scheduler.scheduler = std::make_shared<StepLR>(*sgd, 1, 0.5);
    return OptimizerConfig(sgd, scheduler);
  }
};

// Finds the metadata being saved, for Slope to replace.
struct FindMetadata : Callback {
  void on_save_checkpoint(Trainer&, ModuleBase&, nlohmann::json& checkpoint) override {
    metadata_being_saved = &checkpoint;
  }
};

// A quiet CPU run whose checkpoints hold the states of the callbacks below.
TrainerOptions run_options(const fs::path& dir, int64_t max_epochs, bool checkpointing) {
  TrainerOptions o;
  o.accelerator = "cpu";
  o.devices = 1;
  o.logger = false;
  o.enable_checkpointing = false;
  o.enable_progress_bar = false;
  o.enable_model_summary = false;
  o.num_sanity_val_steps = 0;
  o.default_root_dir = dir.string();
  o.max_epochs = max_epochs;
  o.seed = 0;
  EarlyStoppingOptions early_stopping;
  early_stopping.monitor = "loss";
  early_stopping.strict = false;
  o.callbacks = {std::make_shared<EarlyStopping>(early_stopping), std::make_shared<Timer>(Timer::Duration(3600))};
  if (checkpointing) {
    // Ranks nothing and so writes and removes no file, but keeps and restores its state. Its folder
    // is the same for every run, so that a state from the seed checkpoint is restored in full.
    ModelCheckpointOptions model_checkpoint;
    model_checkpoint.dirpath = (fs::temp_directory_path() / "fulgor_fuzz_checkpoints").string();
    model_checkpoint.monitor = "loss";
    model_checkpoint.save_top_k = 0;
    o.callbacks.push_back(std::make_shared<ModelCheckpoint>(model_checkpoint));
  }
  return o;
}

struct Fixture {
  fs::path dir = fs::temp_directory_path() / ("fulgor_fuzz_checkpoint_" + std::to_string(::getpid()));
  TensorLoader loader{torch::arange(4.0).view({4, 1}), torch::arange(4.0).view({4, 1}) * 0.5, batch_size(2)};
  Slope model;
  std::shared_ptr<FindMetadata> find = std::make_shared<FindMetadata>();
  std::unique_ptr<Trainer> writer;

  Fixture() {
    fs::create_directories(dir);
    // The callbacks' notices (a ModelCheckpoint folder that changed, ...) would drown the fuzzer's output.
    std::cerr.rdbuf(nullptr);
    auto options = run_options(dir, 1, /*checkpointing=*/false);
    options.callbacks.push_back(find);
    writer = std::make_unique<Trainer>(options);
    writer->fit(model, loader);
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  static TensorLoaderOptions batch_size(int64_t size) {
    TensorLoaderOptions options;
    options.batch_size = size;
    return options;
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void read_back(const std::string& path) {
  try {
    read_checkpoint_meta(path);
  } catch (const Error&) {
  }
  try {
    Slope model;
    load_module_weights(model, path);
  } catch (const Error&) {
  }
  try {
    Slope model;
    Trainer trainer(run_options(fixture().dir, 2, /*checkpointing=*/true));
    const FitOptions resume{path};
    trainer.fit(model, fixture().loader, resume);
  } catch (const Error&) {
  }
}

}  // namespace

void checkpoint(const uint8_t* data, size_t size) {
  Fixture& f = fixture();
  const std::string path = (f.dir / "input.ckpt").string();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.substr(0, 8) == "FULGORCK") {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(size));
  } else {
    // Text that is no JSON, or JSON refused, is the options target's business.
    detail::JsonInput metadata = detail::read_json(bytes);
    if (!metadata.error.empty()) return;
    replacement = std::move(metadata.value);
    f.writer->save_checkpoint(path);
    replacement.reset();
  }
  read_back(path);
}

void write_checkpoint_seed(const std::string& path) {
  Slope model;
  Trainer trainer(run_options(fixture().dir, 1, /*checkpointing=*/true));
  trainer.fit(model, fixture().loader);
  trainer.save_checkpoint(path);
}

}  // namespace fulgor::fuzz

FULGOR_FUZZ_TARGET(fulgor::fuzz::checkpoint)
