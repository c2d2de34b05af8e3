// A generative adversarial network on Fashion-MNIST with fulgor's manual
// optimization (Lightning's GAN example, in C++): a generator and a
// discriminator, each with its own Adam, stepped one after the other in
// training_step. At the end of every training epoch the generator draws the
// same 64 latent vectors, and the 8x8 grid of images goes to
// <log_dir>/samples_epoch_<N>.png; the last one is also <log_dir>/samples.png.
//
//   gan [--trainer.max_epochs=5] [--trainer.accelerator=cpu] [--model.latent_dim=64]
//       [--model.lr=0.0002] [--data.batch_size=128] [--data.dir=/usr/share/datasets/fashion-mnist]
//
// The last line of standard output is a JSON summary. Each batch takes two
// optimizer steps, so global_step is twice the batches trained.

#include <fulgor/fulgor.h>

#include <chrono>
#include <iostream>

#include "../fashion_mnist/fashion_mnist_data.h"
#include "png.h"

namespace {

constexpr int64_t kPixels = 28 * 28;

struct LitGAN : fulgor::Module {
  torch::nn::Sequential generator, discriminator;
  torch::Tensor fixed_z;  // the latent vectors of every epoch's sample grid
  int64_t latent_dim;
  double lr;
  std::string last_samples;

  LitGAN(int64_t latent, double learning_rate) : latent_dim(latent), lr(learning_rate) {
    namespace nn = torch::nn;
    auto leaky = [] { return nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)); };
    // Images are scaled to [-1, 1], the range of the generator's tanh.
    generator = nn::Sequential(nn::Linear(latent_dim, 256), leaky(), nn::Linear(256, 512), nn::BatchNorm1d(512),
                               leaky(), nn::Linear(512, kPixels), nn::Tanh());
    // Logits: the losses are binary cross-entropy with logits, which is
    // stable where a sigmoid saturates.
    discriminator =
        nn::Sequential(nn::Linear(kPixels, 512), leaky(), nn::Linear(512, 256), leaky(), nn::Linear(256, 1));
    register_module("generator", generator);
    register_module("discriminator", discriminator);
    // A buffer, so that it moves to the device with the module and a
    // checkpoint keeps it.
    fixed_z = register_buffer("fixed_z", torch::randn({64, latent_dim}));
    save_hyperparameters({{"latent_dim", latent_dim}, {"lr", lr}});
    set_automatic_optimization(false);
  }

  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    auto& opts = optimizers();  // in configure_optimizers' order
    auto& opt_g = opts[0];
    auto& opt_d = opts[1];
    const auto real = batch.data.view({batch.data.size(0), kPixels}) * 2 - 1;
    const auto ones = torch::ones({real.size(0), 1}, real.options());
    const auto zeros = torch::zeros({real.size(0), 1}, real.options());

    // The generator learns to have its images taken for real ones. Only its
    // parameters require gradients here: the discriminator's are left alone.
    torch::Tensor fake;
    {
      auto toggled = toggled_optimizer(opt_g);
      fake = generator->forward(torch::randn({real.size(0), latent_dim}, real.options()));
      auto g_loss = torch::binary_cross_entropy_with_logits(discriminator->forward(fake), ones);
      opt_g.zero_grad();
      manual_backward(g_loss);
      opt_g.step();
      log("g_loss", g_loss, {.prog_bar = true});
    }
    // The discriminator learns to tell them apart, on the same fake images
    // (detached: no gradient goes back into the generator).
    {
      auto toggled = toggled_optimizer(opt_d);
      auto d_loss = (torch::binary_cross_entropy_with_logits(discriminator->forward(real), ones) +
                     torch::binary_cross_entropy_with_logits(discriminator->forward(fake.detach()), zeros)) /
                    2;
      opt_d.zero_grad();
      manual_backward(d_loss);
      opt_d.step();
      log("d_loss", d_loss, {.prog_bar = true});
    }
    return {};
  }

  fulgor::OptimizerConfig configure_optimizers() override {
    // Lightning's GAN example: lr 2e-4, betas (0.5, 0.999), for both.
    auto adam = [&](torch::nn::Sequential& net) {
      return std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(lr).betas({0.5, 0.999}));
    };
    return fulgor::OptimizerConfig({adam(generator), adam(discriminator)});
  }

  void on_train_epoch_end() override {
    if (!trainer().is_global_zero()) return;
    last_samples = trainer().log_dir() + "/samples.png";
    const std::string epoch_png =
        trainer().log_dir() + "/samples_epoch_" + std::to_string(trainer().current_epoch()) + ".png";
    write_samples(epoch_png);
    write_samples(last_samples);
  }

  // The generator's images of fixed_z, in eval mode (BatchNorm's running
  // statistics), as an 8x8 grid with 2-pixel grey lines between them.
  void write_samples(const std::string& path) {
    torch::NoGradGuard no_grad;
    generator->eval();
    auto images = generator->forward(fixed_z).to(torch::kCPU, torch::kFloat32);
    generator->train();
    images = images.add(1).mul(127.5).round().clamp(0, 255).to(torch::kUInt8).view({8, 8, 28, 28});
    constexpr int64_t kPad = 2, kSide = 8 * 28 + 9 * kPad;
    auto grid = torch::full({kSide, kSide}, 128, torch::kUInt8);
    for (int64_t row = 0; row < 8; ++row)
      for (int64_t col = 0; col < 8; ++col) {
        const int64_t y = kPad + row * (28 + kPad), x = kPad + col * (28 + kPad);
        grid.slice(0, y, y + 28).slice(1, x, x + 28).copy_(images[row][col]);
      }
    png::write_gray(path, grid.data_ptr<uint8_t>(), kSide, kSide);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  // A fulgor error ends the program with its message: status 2 for a bad command line, 1 for others.
  return fulgor::run_main(argc, argv, [&] {
    fulgor::TrainerOptions defaults;
    defaults.max_epochs = 5;
    defaults.default_root_dir = "gan_logs";
    const nlohmann::json sections = {{"model", {{"latent_dim", 64}, {"lr", 2e-4}}},
                                     {"data", {{"batch_size", 128}, {"dir", fashion_mnist::kDefaultDir}}}};
    auto cli = fulgor::parse_command_line(argc, argv, defaults, sections);
    if (cli.help_requested) {
      std::cout << fulgor::command_line_help(argv[0], defaults, sections);
      return 0;
    }
    const auto latent_dim = cli.get<int64_t>("model", "latent_dim", 64);
    const auto lr = cli.get<double>("model", "lr", 2e-4);
    const auto batch_size = cli.get<int64_t>("data", "batch_size", 128);
    const auto dir = cli.get<std::string>("data", "dir", fashion_mnist::kDefaultDir);
    if (latent_dim < 1)
      throw fulgor::ConfigError("--model.latent_dim: expected at least 1, got " + std::to_string(latent_dim));
    fulgor::seed_everything(cli.trainer.seed.value_or(0));

    // All 60000 training images; a GAN has no validation set.
    auto [images, labels] = fashion_mnist::load(dir, /*train=*/true);
    fulgor::TensorLoader loader(
        images, labels,
        {.batch_size = batch_size, .shuffle = true, .drop_last = true, .seed = cli.trainer.seed.value_or(0)});

    LitGAN model(latent_dim, lr);
    auto options = cli.trainer;
    if (options.logger && options.loggers.empty()) {
      // A metrics.csv (which fulgor-plot draws) beside the TensorBoard files.
      auto tensorboard = std::make_shared<fulgor::TensorBoardLogger>(options.default_root_dir);
      fulgor::FileLoggerOptions csv{.save_dir = options.default_root_dir, .version = tensorboard->version_number()};
      options.loggers = {tensorboard, std::make_shared<fulgor::CSVLogger>(csv)};
    }
    fulgor::Trainer trainer(options);
    auto fit = trainer.fit(model, loader);

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto& metrics = trainer.callback_metrics();
    nlohmann::json summary = {{"g_loss", metrics.count("g_loss") ? metrics.at("g_loss") : NAN},
                              {"d_loss", metrics.count("d_loss") ? metrics.at("d_loss") : NAN},
                              {"epochs", fit.epochs_completed},
                              {"global_step", fit.global_step},
                              {"stopped_because", fit.message},
                              {"accelerator", trainer.accelerator().name()},
                              {"samples", model.last_samples},
                              {"log_dir", trainer.log_dir()},
                              {"seconds", seconds}};
    if (trainer.is_global_zero()) std::cout << summary.dump() << std::endl;
    return 0;
  });
}
