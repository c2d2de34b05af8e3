// The LitAutoEncoder of PyTorch Lightning's README, in C++, on Fashion-MNIST.
//
//   autoencoder [--trainer.max_epochs=1] [--trainer.limit_train_batches=100] [--data.dir=DIR]
//
// The last line of standard output is a JSON summary.

#include <fulgor/fulgor.h>

#include <iostream>

#include "../fashion_mnist/fashion_mnist_data.h"

namespace {

struct LitAutoEncoder : fulgor::Module {
  torch::nn::Sequential encoder{torch::nn::Linear(28 * 28, 64), torch::nn::ReLU(), torch::nn::Linear(64, 3)};
  torch::nn::Sequential decoder{torch::nn::Linear(3, 64), torch::nn::ReLU(), torch::nn::Linear(64, 28 * 28)};

  LitAutoEncoder() {
    register_module("encoder", encoder);
    register_module("decoder", decoder);
  }

  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    auto x = batch.data.view({batch.data.size(0), -1});
    auto z = encoder->forward(x);
    auto x_hat = decoder->forward(z);
    auto loss = torch::mse_loss(x_hat, x);
    log("train_loss", loss, {.prog_bar = true});
    return loss;
  }

  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
  }
};

}  // namespace

int main(int argc, char** argv) {
  // A fulgor error ends the program with its message: status 2 for a bad command line, 1 for others.
  return fulgor::run_main(argc, argv, [&] {
    fulgor::TrainerOptions defaults;
    defaults.max_epochs = 1;
    defaults.limit_train_batches = 100;
    defaults.default_root_dir = "autoencoder_logs";
    const nlohmann::json sections = {{"data", {{"dir", fashion_mnist::kDefaultDir}}}};
    auto cli = fulgor::parse_command_line(argc, argv, defaults, sections);
    if (cli.help_requested) {
      std::cout << fulgor::command_line_help(argv[0], defaults, sections);
      return 0;
    }
    fulgor::seed_everything(cli.trainer.seed.value_or(0));
    auto [images, labels] =
        fashion_mnist::load(cli.get<std::string>("data", "dir", fashion_mnist::kDefaultDir), /*train=*/true);
    auto loader = fulgor::make_data_loader(
        fashion_mnist::Dataset(images, labels).map(torch::data::transforms::Stack<>()), /*batch_size=*/64);

    LitAutoEncoder autoencoder;
    fulgor::Trainer trainer(cli.trainer);
    auto fit = trainer.fit(autoencoder, loader);

    // Embed a few images with the trained encoder, as the README does.
    torch::NoGradGuard no_grad;
    autoencoder.eval();
    auto embeddings = autoencoder.encoder->forward(images.slice(0, 0, 4).view({4, -1}).to(trainer.device()));
    nlohmann::json summary = {{"train_loss", trainer.callback_metrics().at("train_loss")},
                              {"epochs", fit.epochs_completed},
                              {"global_step", fit.global_step},
                              {"accelerator", trainer.accelerator().name()},
                              {"embedding_shape", embeddings.sizes().vec()}};
    std::cout << summary.dump() << std::endl;
    return 0;
  });
}
