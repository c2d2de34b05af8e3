// Fashion-MNIST classification with fulgor: a small CNN (or an MLP with
// --model.arch=mlp) trained on whatever accelerator "auto" picks, with a
// progress bar, checkpoints and metrics (TensorBoard event files, and a
// metrics.csv that fulgor-plot draws), then tested on the best checkpoint.
// The data is a DataModule: it reads the files once per node, splits them,
// and makes each loop's loader.
//
//   fashion_mnist [--trainer.max_epochs=4] [--trainer.accelerator=cpu] [--model.arch=mlp]
//                 [--model.lr=0.001] [--data.batch_size=128] [--data.dir=/usr/share/datasets/fashion-mnist]
//
// The last line of standard output is a JSON summary (printed by rank 0 alone).
// Data-parallel on two processes (strategy "auto" becomes "ddp" under a
// launcher; the Trainer gives each rank its shard of every split, and each
// takes half of --data.batch_size per batch):
//
//   fulgor-run --nproc-per-node 2 -- fashion_mnist --trainer.accelerator=cpu

#include <fulgor/fulgor.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <optional>

#include "fashion_mnist_data.h"

namespace {

// Fashion-MNIST's 60,000 training images (the last 5,000 validate, as in
// Lightning's MNIST examples) and 10,000 test images, in memory.
struct FashionMNIST : fulgor::DataModule {
  std::string dir;
  int64_t batch_size;
  uint64_t seed;
  std::optional<fulgor::TensorLoader> train, val, test;

  FashionMNIST(std::string data_dir, int64_t global_batch_size, uint64_t shuffle_seed)
      : dir(std::move(data_dir)), batch_size(global_batch_size), seed(shuffle_seed) {
    save_hyperparameters({{"batch_size", batch_size}});
  }

  // Fails early, on one process per node, when the files are missing.
  void prepare_data() override { fashion_mnist::load(dir, /*train=*/false); }

  void setup(const std::string& stage) override {
    // --data.batch_size is the global batch: each of N processes takes 1/N
    // of it, so N processes train as one does.
    const int64_t processes = trainer().world_size();
    if (batch_size % processes != 0)
      throw fulgor::ConfigError("--data.batch_size=" + std::to_string(batch_size) + " does not divide over " +
                                std::to_string(processes) + " processes: give a multiple of " +
                                std::to_string(processes));
    const fulgor::TensorLoaderOptions options{.batch_size = batch_size / processes, .seed = seed};
    if (stage == "fit" || stage == "validate") {
      auto [x, y] = fashion_mnist::load(dir, /*train=*/true);
      const int64_t n_train = x.size(0) - 5000;
      auto shuffled = options;
      shuffled.shuffle = true;
      train.emplace(x.slice(0, 0, n_train), y.slice(0, 0, n_train), shuffled);
      val.emplace(x.slice(0, n_train), y.slice(0, n_train), options);
    }
    if (stage == "test") {
      auto [x, y] = fashion_mnist::load(dir, /*train=*/false);
      test.emplace(x, y, options);
    }
  }

  // Training batches are copied onto the device one step ahead.
  fulgor::AnyLoader<> train_loader() override { return fulgor::DevicePrefetcher(*train); }
  fulgor::AnyLoader<> val_loader() override { return std::ref(*val); }
  fulgor::AnyLoader<> test_loader() override { return std::ref(*test); }
};

struct LitClassifier : fulgor::Module {
  torch::nn::Sequential net;
  double lr;

  LitClassifier(const std::string& arch, double learning_rate) : lr(learning_rate) {
    namespace nn = torch::nn;
    if (arch == "cnn") {
      // Small enough to train an epoch in well under a minute on two CPU cores.
      net = nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 16, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                           nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                           nn::Flatten(), nn::Linear(32 * 7 * 7, 64), nn::ReLU(), nn::Linear(64, 10));
    } else if (arch == "mlp") {
      net = nn::Sequential(nn::Flatten(), nn::Linear(28 * 28, 256), nn::ReLU(), nn::Dropout(0.2), nn::Linear(256, 10));
    } else {
      throw fulgor::ConfigError("--model.arch: expected \"cnn\" or \"mlp\", got \"" + arch + "\"");
    }
    register_module("net", net);
    save_hyperparameters({{"arch", arch}, {"lr", lr}});
  }

  // Normalised with Fashion-MNIST's pixel mean and standard deviation.
  torch::Tensor forward(const torch::Tensor& x) { return net->forward((x - 0.2860) / 0.3530); }

  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    auto loss = torch::cross_entropy_loss(forward(batch.data), batch.target);
    log("train_loss", loss, {.prog_bar = true});
    return loss;
  }

  void evaluate(const torch::data::Example<>& batch, const std::string& stage) {
    auto logits = forward(batch.data);
    // Each rank sees its shard: the ranks' means are averaged.
    log(stage + "_loss", torch::cross_entropy_loss(logits, batch.target), {.prog_bar = true, .sync_dist = true});
    log(stage + "_acc", logits.argmax(1).eq(batch.target).to(torch::kFloat32).mean(),
        {.prog_bar = true, .sync_dist = true});
  }
  void validation_step(torch::data::Example<> batch, int64_t) override { evaluate(batch, "val"); }
  void test_step(torch::data::Example<> batch, int64_t) override { evaluate(batch, "test"); }

  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr));
  }
};

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  // A fulgor error ends the program with its message: status 2 for a bad command line, 1 for others.
  return fulgor::run_main(argc, argv, [&] {
    fulgor::TrainerOptions defaults;
    defaults.max_epochs = 4;
    defaults.default_root_dir = "fashion_mnist_logs";
    // The program's own options: a key not declared here is refused (--model.archh=mlp).
    const nlohmann::json sections = {{"model", {{"arch", "cnn"}, {"lr", 1e-3}}},
                                     {"data", {{"batch_size", 128}, {"dir", fashion_mnist::kDefaultDir}}}};
    auto cli = fulgor::parse_command_line(argc, argv, defaults, sections);
    if (cli.help_requested) {
      std::cout << fulgor::command_line_help(argv[0], defaults, sections) << "\n--model.arch is cnn or mlp.\n";
      return 0;
    }
    const auto arch = cli.get<std::string>("model", "arch", "cnn");
    const auto lr = cli.get<double>("model", "lr", 1e-3);
    const auto batch_size = cli.get<int64_t>("data", "batch_size", 128);
    const auto dir = cli.get<std::string>("data", "dir", fashion_mnist::kDefaultDir);
    fulgor::seed_everything(cli.trainer.seed.value_or(0));
    FashionMNIST data(dir, batch_size, cli.trainer.seed.value_or(0));

    LitClassifier model(arch, lr);
    auto options = cli.trainer;
    if (options.logger && options.loggers.empty()) {
      // Both in one run folder: the CSV logger takes the TensorBoard logger's version.
      auto tensorboard = std::make_shared<fulgor::TensorBoardLogger>(options.default_root_dir);
      fulgor::FileLoggerOptions csv{.save_dir = options.default_root_dir, .version = tensorboard->version_number()};
      options.loggers = {tensorboard, std::make_shared<fulgor::CSVLogger>(csv)};
    }
    auto checkpoint = std::make_shared<fulgor::ModelCheckpoint>(fulgor::ModelCheckpointOptions{
        .filename = "{epoch}-{val_acc:.4f}", .monitor = "val_acc", .mode = "max", .save_top_k = 1, .save_last = true});
    if (options.enable_checkpointing) options.callbacks.push_back(checkpoint);
    fulgor::Trainer trainer(options);
    auto fit = trainer.fit(model, data);
    const bool have_best = options.enable_checkpointing && !checkpoint->best_model_path().empty();
    auto test = trainer.test(model, data, {.ckpt_path = have_best ? "best" : ""});

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    nlohmann::json summary = {{"test_acc", test.at("test_acc")},
                              {"test_loss", test.at("test_loss")},
                              {"epochs", fit.epochs_completed},
                              {"global_step", fit.global_step},
                              {"stopped_because", fit.message},
                              {"accelerator", trainer.accelerator().name()},
                              {"world_size", trainer.world_size()},
                              {"model", arch},
                              {"best_checkpoint", have_best ? checkpoint->best_model_path() : ""},
                              {"log_dir", trainer.log_dir()},
                              {"seconds", seconds}};
    if (trainer.is_global_zero()) std::cout << summary.dump() << std::endl;
    return 0;
  });
}
