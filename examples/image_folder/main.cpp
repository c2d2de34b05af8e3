// Trains a small CNN on images read from a folder on disk (root/<class>/*.png)
// by fulgor::ImageLoader: threads decode and augment them straight into the
// batches. Without a folder of your own it writes a small generated one
// (10 classes of striped patterns, one angle per class).
//
//   image_folder DATA_DIR WORK_DIR [--epochs N] [--stop-at STEP] [--resume CKPT]
//
// Each training step prints "step N TARGETS": a run stopped with --stop-at
// (which saves WORK_DIR/stopped.ckpt) and resumed with --resume prints the
// same steps after N as a run never stopped.

#include <fulgor/fulgor.h>
#include <png.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace {

// 10 classes x 24 PNGs of 36 x 36: stripes at the class's angle, phase by image.
void write_generated_folder(const std::string& root) {
  for (int c = 0; c < 10; ++c) {
    const std::string dir = root + "/class" + std::to_string(c);
    std::filesystem::create_directories(dir);
    const double angle = c * M_PI / 10;
    for (int i = 0; i < 24; ++i) {
      std::vector<uint8_t> pixels(36 * 36 * 3);
      for (int y = 0; y < 36; ++y)
        for (int x = 0; x < 36; ++x) {
          const double v = std::sin((x * std::cos(angle) + y * std::sin(angle)) * 0.7 + i);
          for (int k = 0; k < 3; ++k)
            pixels[static_cast<size_t>((y * 36 + x) * 3 + k)] = static_cast<uint8_t>(127 + 100 * v + 10 * k);
        }
      png_image image;
      std::memset(&image, 0, sizeof image);
      image.version = PNG_IMAGE_VERSION;
      image.width = image.height = 36;
      image.format = PNG_FORMAT_RGB;
      const std::string path = dir + "/" + std::to_string(i) + ".png";
      png_image_write_to_file(&image, path.c_str(), 0, pixels.data(), 0, nullptr);
    }
  }
}

struct SmallCnn : fulgor::Module {
  SmallCnn() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(32 * 8 * 8, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc(x.flatten(1));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    std::cout << "step " << steps++ << " " << batch.target.sum().item<int64_t>() << " "
              << batch.data.sum().item<double>() << "\n";
    auto loss = torch::nn::functional::cross_entropy(forward(batch.data), batch.target);
    log("train_loss", loss);
    return loss;
  }
  fulgor::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};
  int64_t steps = 0;
};

// Saves a checkpoint after global step `at` and stops there.
struct StopAt : fulgor::Callback {
  StopAt(int64_t at, std::string path) : at(at), path(std::move(path)) {}
  void on_train_batch_end(fulgor::Trainer& t, fulgor::ModuleBase&, const torch::Tensor&, int64_t) override {
    if (t.global_step() != at) return;
    t.save_checkpoint(path);
    t.request_stop("stopped at step " + std::to_string(at));
  }
  int64_t at;
  std::string path;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: image_folder DATA_DIR WORK_DIR [--epochs N] [--stop-at STEP] [--resume CKPT]\n";
    return 2;
  }
  // A fulgor error ends the program with its message and status 1 (2 for a ConfigError).
  return fulgor::run_main(argc, argv, [&] {
    const std::string data = argv[1], work = argv[2];
    int64_t epochs = 2, stop_at = -1;
    std::string resume;
    for (int i = 3; i + 1 < argc; i += 2) {
      const std::string a = argv[i];
      if (a == "--epochs")
        epochs = std::stoll(argv[i + 1]);
      else if (a == "--stop-at")
        stop_at = std::stoll(argv[i + 1]);
      else if (a == "--resume")
        resume = argv[i + 1];
    }
    if (!std::filesystem::exists(data)) write_generated_folder(data);
    torch::manual_seed(0);

    auto folder = std::make_shared<fulgor::ImageFolder>(data);
    fulgor::ImageTransforms augment({fulgor::RandomResizedCrop{{32}, {0.6, 1.0}}, fulgor::RandomHorizontalFlip{},
                                     fulgor::Normalize{{0.5}, {0.25}}});
    fulgor::ImageLoaderOptions options;
    options.batch_size = 16;
    options.shuffle = true;
    options.num_workers = 2;
    fulgor::ImageLoader train(folder, augment, options);

    fulgor::TrainerOptions trainer_options;
    trainer_options.max_epochs = epochs;
    trainer_options.default_root_dir = work;
    trainer_options.enable_progress_bar = false;
    trainer_options.enable_model_summary = false;
    trainer_options.enable_checkpointing = false;
    trainer_options.logger = false;
    if (stop_at > 0) trainer_options.callbacks = {std::make_shared<StopAt>(stop_at, work + "/stopped.ckpt")};
    SmallCnn model;
    fulgor::FitOptions fit;
    fit.ckpt_path = resume;
    fulgor::Trainer(trainer_options).fit(model, train, fit);
    std::cout << "trained on " << folder->size() << " images in " << folder->classes().size() << " classes\n";
    return 0;
  });
}
