// A training loop of one's own, run by fulgor::Fabric: a classifier of two
// interleaved spirals, on every device the options select, resumed from its
// checkpoint when there is one.
//
//   fabric_spirals [--accelerator=auto] [--devices=1] [--precision=32-true]
//                  [--epochs=20] [--accumulate=2] [--dir=fabric_logs]
//
// --devices=2 on the CPU trains on two processes: the program starts the
// second itself. The last line of standard output is a JSON summary.

#include <fulgor/fulgor.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>

namespace {

// 2 * n points of two spirals, labelled 0 and 1, with a little noise.
std::pair<torch::Tensor, torch::Tensor> spirals(int64_t n) {
  torch::Generator generator = at::detail::createCPUGenerator(42);
  torch::Tensor t = torch::linspace(0.25, 3 * M_PI, n);
  torch::Tensor a = torch::stack({t * torch::cos(t), t * torch::sin(t)}, 1);
  torch::Tensor x = torch::cat({a, -a}) / (3 * M_PI) + 0.02 * torch::randn({2 * n, 2}, generator);
  torch::Tensor y = torch::cat({torch::zeros({n}, torch::kLong), torch::ones({n}, torch::kLong)});
  return {x, y};
}

constexpr const char* kUsage =
    "usage: fabric_spirals [--accelerator=auto] [--devices=1] [--precision=32-true] [--epochs=20] [--accumulate=2] "
    "[--dir=fabric_logs]";

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> options = {{"accelerator", "auto"}, {"devices", "1"},    {"precision", "32-true"},
                                                {"epochs", "20"},        {"accumulate", "2"}, {"dir", "fabric_logs"}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos || !options.count(arg.substr(2, eq - 2)))
      throw fulgor::ConfigError("unknown argument '" + arg + "'; " + kUsage);
    options[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--help") {
    std::cout << kUsage << "\n";
    return 0;
  }
  // A bad argument ends the program with its message and status 2.
  return fulgor::run_main(argc, argv, [&] {
    auto args = parse(argc, argv);
    const int64_t epochs = std::stoll(args["epochs"]), accumulate = std::stoll(args["accumulate"]);
    const std::string checkpoint = args["dir"] + "/last.ckpt";

    fulgor::Fabric fabric({.accelerator = args["accelerator"],
                           .devices = args["devices"],
                           .precision = args["precision"],
                           .loggers = {std::make_shared<fulgor::CSVLogger>(args["dir"])}});
    fabric.launch();
    fabric.seed_everything(7);

    auto model = torch::nn::Sequential(torch::nn::Linear(2, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                                       torch::nn::ReLU(), torch::nn::Linear(64, 2));
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(3e-3));
    auto optimizer = fabric.setup(model, adam);
    auto [x, y] = spirals(512);
    fulgor::TensorLoaderOptions batches;
    batches.batch_size = 32;
    batches.shuffle = true;
    auto loader = fabric.setup_dataloaders(fulgor::TensorLoader(x, y, batches));

    int64_t epoch = 0;
    if (std::filesystem::exists(checkpoint)) {
      fabric.load(checkpoint, {{"model", model}, {"optimizer", adam}, {"epoch", epoch}});
      loader.set_epoch(epoch);
      fabric.print("resumed at epoch", epoch);
    }
    double loss_mean = 0;
    for (; epoch < epochs; ++epoch) {
      torch::Tensor epoch_loss = torch::zeros({}, fabric.device());
      int64_t i = 0;
      for (auto& batch : loader) {
        const bool steps = ++i % accumulate == 0;
        torch::Tensor loss;
        {
          // Accumulating batches skip the gradients' all_reduce.
          auto no_sync = fabric.no_backward_sync(*model, !steps);
          auto autocast = fabric.autocast();
          loss = torch::cross_entropy_loss(model->forward(batch.data), batch.target);
          fabric.backward(loss / static_cast<double>(accumulate));
        }
        if (steps) {
          fabric.clip_gradients(*model, optimizer, {.max_norm = 1.0});
          optimizer.step();
          optimizer.zero_grad();
        }
        epoch_loss += loss.detach().to(torch::kFloat);
      }
      loss_mean = fabric.all_reduce(epoch_loss / static_cast<double>(i)).item<double>();
      fabric.log("train_loss", loss_mean, epoch);
      if (epoch % 5 == 4) fabric.print("epoch", epoch, "loss", loss_mean);
      int64_t next = epoch + 1;
      fabric.save(checkpoint, {{"model", model}, {"optimizer", adam}, {"epoch", next}});
    }

    torch::NoGradGuard no_grad;
    model->eval();
    auto correct = model->forward(fabric.to_device(x)).argmax(1).eq(fabric.to_device(y)).sum();
    const double accuracy = correct.item<double>() / static_cast<double>(x.size(0));
    for (auto& logger : fabric.loggers()) logger->finalize("success");
    fabric.print(nlohmann::json{
        {"world_size", fabric.world_size()},
        {"device", fabric.device().str()},
        {"train_loss", loss_mean},
        {"accuracy",
         accuracy}}.dump());
  });
}
