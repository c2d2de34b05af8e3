// The C API's train call against the same step written in C++: a
// 1024-1024-10 MLP as a TorchScript file, Adam 1e-3 and cross-entropy on
// host buffers of 64 samples, one fulgor_train call against forward, loss,
// zero_grad, backward, step and the loss's value on the same file's module
// loaded with torch::jit::load. A third column, the same MLP as a
// torch::nn::Sequential, shows what running it through TorchScript costs.
// Runs are paired and interleaved (Note [Paired runs] in
// overhead_benchmark.cpp); the ratio is the median of the pairs' ratios.

#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "benchmarks.h"
#include "fulgor/c/fulgor.h"

namespace fulgor::bench {
namespace {

constexpr int64_t kInputs = 1024, kHidden = 1024, kClasses = 10, kSamples = 64;

// The MLP as a TorchScript module, made in C++ so that no Python is needed.
void write_script_mlp(const std::string& path) {
  torch::manual_seed(0);
  torch::jit::Module m("MLP");
  m.register_attribute("training", c10::BoolType::get(), true);
  // As nn.Parameter does, which a module made in C++ does not.
  const auto parameter = [](torch::Tensor t) { return t.requires_grad_(); };
  m.register_parameter("w1", parameter(torch::randn({kHidden, kInputs}) * 0.03), false);
  m.register_parameter("b1", parameter(torch::zeros({kHidden})), false);
  m.register_parameter("w2", parameter(torch::randn({kClasses, kHidden}) * 0.03), false);
  m.register_parameter("b2", parameter(torch::zeros({kClasses})), false);
  m.define(R"(
def forward(self, x):
    return torch.linear(torch.relu(torch.linear(x, self.w1, self.b1)), self.w2, self.b2)
)");
  m.save(path);
}

torch::nn::Sequential native_mlp(const torch::jit::Module& script) {
  torch::nn::Sequential net(torch::nn::Linear(kInputs, kHidden), torch::nn::ReLU(), torch::nn::Linear(kHidden, kClasses));
  torch::NoGradGuard no_grad;
  auto params = net->parameters();
  std::vector<torch::Tensor> source;
  for (const auto& p : script.parameters()) source.push_back(p);
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(source[i]);
  return net;
}

void check(fulgor_status status, const char* what) {
  if (status != FULGOR_OK) throw std::runtime_error(std::string(what) + ": " + fulgor_last_error());
}

}  // namespace

void c_api_benchmark(Report& report, const Settings& settings) {
  const auto dir = std::filesystem::temp_directory_path() / ("fulgor-c-api-benchmark-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "mlp.pt").string();
  write_script_mlp(path);

  const torch::Tensor input = torch::randn({kSamples, kInputs});
  const torch::Tensor label = torch::randint(kClasses, {kSamples}, torch::kLong);
  const int64_t input_shape[] = {kSamples, kInputs}, label_shape[] = {kSamples};
  const int steps = settings.quick ? 5 : 50;

  fulgor_model* model = nullptr;
  check(fulgor_model_create(path.c_str(),
                            R"({"accelerator": "cpu", "loss": "cross_entropy", "optimizer": {"type": "adam", "lr": 0.001}})",
                            &model),
        "fulgor_model_create");
  std::unique_ptr<fulgor_model, void (*)(fulgor_model*)> owned(model, fulgor_model_destroy);

  torch::jit::Module script = torch::jit::load(path);
  script.train();
  std::vector<torch::Tensor> script_params;
  for (const auto& p : script.parameters()) script_params.push_back(p);
  torch::optim::Adam script_adam(script_params, torch::optim::AdamOptions(1e-3));
  torch::nn::Sequential native = native_mlp(script);
  torch::optim::Adam native_adam(native->parameters(), torch::optim::AdamOptions(1e-3));

  double sink = 0;
  // The host buffers as the C API sees them, wrapped anew each step as it does.
  const auto host_batch = [&] {
    return std::pair{torch::from_blob(input.data_ptr(), {kSamples, kInputs}, torch::kFloat),
                     torch::from_blob(label.data_ptr(), {kSamples}, torch::kLong)};
  };
  auto c_api = [&] {
    for (int i = 0; i < steps; ++i) {
      double loss = 0;
      check(fulgor_train(model, input.data_ptr(), FULGOR_FLOAT32, input_shape, 2, label.data_ptr(), FULGOR_INT64,
                         label_shape, 1, &loss),
            "fulgor_train");
      sink += loss;
    }
  };
  auto cpp_script = [&] {
    for (int i = 0; i < steps; ++i) {
      auto [x, y] = host_batch();
      script_adam.zero_grad();
      auto loss = torch::cross_entropy_loss(script.forward({x}).toTensor(), y);
      loss.backward();
      script_adam.step();
      sink += loss.item<double>();
    }
  };
  auto cpp_native = [&] {
    for (int i = 0; i < steps; ++i) {
      auto [x, y] = host_batch();
      native_adam.zero_grad();
      auto loss = torch::cross_entropy_loss(native->forward(x), y);
      loss.backward();
      native_adam.step();
      sink += loss.item<double>();
    }
  };
  const int pairs = settings.quick ? settings.repeats : 8 * settings.repeats;
  const auto times = interleaved_times({cpp_script, c_api, cpp_native}, pairs);
  std::vector<double> vs_script, vs_native;
  for (int i = 0; i < pairs; ++i) {
    vs_script.push_back(times[1][i] / times[0][i]);
    vs_native.push_back(times[1][i] / times[2][i]);
  }
  const auto [low, high] = median_interval(vs_script);
  const auto per_step = [&](size_t k) { return fmt::format("{:.2f} ms/step", median(times[k]) / steps * 1e3); };
  report.row({"c_api", "C++ step on the TorchScript module", per_step(0), ""});
  report.row({"c_api", "fulgor_train", per_step(1),
              fmt::format("{:.3f}x [{:.3f}, {:.3f}] the C++ step", median(vs_script), low, high)});
  report.row({"c_api", "C++ step on a torch::nn::Sequential", per_step(2),
              fmt::format("fulgor_train {:.3f}x", median(vs_native))});
  report.figures["c_api_train_ratio"] = median(vs_script);
  report.figures["c_api_train_vs_native_ratio"] = median(vs_native);
  if (!std::isfinite(sink)) throw std::runtime_error("the C API benchmark's losses are not finite");
  std::filesystem::remove_all(dir);
}

}  // namespace fulgor::bench
