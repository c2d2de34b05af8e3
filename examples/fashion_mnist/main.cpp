// Fashion-MNIST classification with fulgor: a small CNN (or an MLP with
// --model.arch=mlp) trained on whatever accelerator "auto" picks, with a
// progress bar, checkpoints and metrics (TensorBoard event files, and a
// metrics.csv that fulgor-plot draws), then tested on the best checkpoint.
//
//   fashion_mnist [--trainer.max_epochs=4] [--trainer.accelerator=cpu] [--model.arch=mlp]
//                 [--model.lr=0.001] [--data.batch_size=128] [--data.dir=/usr/share/datasets/fashion-mnist]
//
// The last line of standard output is a JSON summary (printed by rank 0 alone).
// Data-parallel on two processes (strategy "auto" becomes "ddp" under a
// launcher; each rank reads its shard of every split through a
// DistributedSampler, with half of --data.batch_size per batch):
//
//   fulgor-run --nproc-per-node 2 -- fashion_mnist --trainer.accelerator=cpu

#include <fulgor/fulgor.h>

#include <chrono>
#include <iostream>

#include "fashion_mnist_data.h"

namespace {

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
  try {
    fulgor::TrainerOptions defaults;
    defaults.max_epochs = 4;
    defaults.default_root_dir = "fashion_mnist_logs";
    auto cli = fulgor::parse_command_line(argc, argv, defaults);
    if (cli.help_requested) {
      std::cout << fulgor::command_line_help(argv[0], defaults)
                << "\nModel and data: --model.arch=cnn|mlp --model.lr=0.001 --data.batch_size=128 --data.dir=DIR\n";
      return 0;
    }
    const auto arch = cli.get<std::string>("model", "arch", "cnn");
    const auto lr = cli.get<double>("model", "lr", 1e-3);
    const auto batch_size = cli.get<int64_t>("data", "batch_size", 128);
    const auto dir = cli.get<std::string>("data", "dir", fashion_mnist::kDefaultDir);
    fulgor::seed_everything(cli.trainer.seed.value_or(0));

    // The last 5000 training images validate, as in Lightning's MNIST examples.
    auto [train_x, train_y] = fashion_mnist::load(dir, /*train=*/true);
    auto [test_x, test_y] = fashion_mnist::load(dir, /*train=*/false);
    const int64_t n_train = train_x.size(0) - 5000;
    // Every process reads its own shard (all of it when it runs alone); the
    // training shards are reshuffled each epoch, the same way on every rank.
    // --data.batch_size is the global batch: each of N processes takes 1/N of
    // it, so N processes train as one does.
    const auto job = fulgor::detect_distributed_environment();
    if (batch_size % job.world_size != 0)
      throw fulgor::ConfigError("--data.batch_size=" + std::to_string(batch_size) + " does not divide over " +
                                std::to_string(job.world_size) + " processes: give a multiple of " +
                                std::to_string(job.world_size));
    const int64_t rank_batch_size = batch_size / job.world_size;
    auto batches = [&](torch::Tensor x, torch::Tensor y, bool shuffle) {
      fulgor::DistributedSamplerOptions sampler_options;
      sampler_options.shuffle = shuffle;
      sampler_options.seed = cli.trainer.seed.value_or(0);
      auto sampler = std::make_unique<fulgor::DistributedSampler>(static_cast<size_t>(x.size(0)), job.world_size,
                                                                  job.rank, sampler_options);
      return fulgor::TensorLoader(x, y, std::move(sampler), {.batch_size = rank_batch_size});
    };
    auto train_loader = batches(train_x.slice(0, 0, n_train), train_y.slice(0, 0, n_train), true);
    auto val_loader = batches(train_x.slice(0, n_train), train_y.slice(0, n_train), false);
    auto test_loader = batches(test_x, test_y, false);

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
    // Training batches are copied onto the device one step ahead.
    fulgor::DevicePrefetcher prefetched_train(train_loader);
    auto fit = trainer.fit(model, prefetched_train, val_loader);
    const bool have_best = options.enable_checkpointing && !checkpoint->best_model_path().empty();
    auto test = trainer.test(model, test_loader, {.ckpt_path = have_best ? "best" : ""});

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    nlohmann::json summary = {{"test_acc", test.at("test_acc")},
                              {"test_loss", test.at("test_loss")},
                              {"epochs", fit.epochs_completed},
                              {"global_step", fit.global_step},
                              {"stopped_because", fit.message},
                              {"accelerator", trainer.accelerator().name()},
                              {"model", arch},
                              {"best_checkpoint", have_best ? checkpoint->best_model_path() : ""},
                              {"log_dir", trainer.log_dir()},
                              {"seconds", seconds}};
    if (trainer.is_global_zero()) std::cout << summary.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 1;
  }
}
