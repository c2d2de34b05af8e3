// Developer check for an emulated device library: loads it the way fulgor
// loads a vendor runtime, then compares what runs on the device with the CPU.
//
//   fulgor_emulated_device_check <path to libfulgor_emulated_*.so> <xpu|npu>
//
// Prints one PASS or FAIL line per check and exits non-zero if any failed.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

namespace {

constexpr double kTolerance = 1e-5;

using MemoryQuery = int64_t (*)(int, int);
using CountQuery = int (*)();

struct Library {
  void* handle;
  torch::DeviceType type;
  std::string name;
};

// A check returns an empty string when it passes and the reason otherwise.
using Check = std::function<std::string()>;

class Runner {
 public:
  void run(const std::string& name, const Check& check) {
    std::string failure;
    try {
      failure = check();
    } catch (const std::exception& error) {
      const std::string what = error.what();
      failure = "threw: " + what.substr(0, what.find('\n'));
    }
    ++checks_;
    if (failure.empty()) {
      std::cout << "PASS " << name << '\n';
    } else {
      ++failures_;
      std::cout << "FAIL " << name << ": " << failure << '\n';
    }
  }

  int finish() const {
    if (failures_ == 0) {
      std::cout << "PASS all " << checks_ << " checks\n";
      return EXIT_SUCCESS;
    }
    std::cout << "FAIL " << failures_ << " of " << checks_ << " checks\n";
    return EXIT_FAILURE;
  }

 private:
  int checks_ = 0;
  int failures_ = 0;
};

template <typename T>
std::string describe(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::string compare(const torch::Tensor& device_result, const torch::Tensor& cpu_result) {
  const torch::Tensor back = device_result.cpu();
  if (back.sizes() != cpu_result.sizes()) {
    return "shape " + describe(back.sizes()) + " instead of " + describe(cpu_result.sizes());
  }
  if (!torch::allclose(back, cpu_result, /*rtol=*/0, /*atol=*/kTolerance)) {
    return "values differ from the CPU by up to " + describe((back - cpu_result).abs().max().item<double>());
  }
  return {};
}

int expected_device_count() {
  const char* text = std::getenv("FULGOR_EMULATED_DEVICE_COUNT");
  return text == nullptr || *text == '\0' ? 2 : std::atoi(text);
}

torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4));
}

// torch::nn::Module::to cannot move parameters to a PrivateUse1 device
// (set_data refuses), so npu parameters are swapped in place, as fulgor does.
void move_module(torch::nn::Module& module, const torch::Device& device) {
  if (device.type() != torch::kPrivateUse1) {
    module.to(device);
    return;
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> tensors = module.parameters();
  for (const torch::Tensor& buffer : module.buffers()) {
    tensors.push_back(buffer);
  }
  for (torch::Tensor& tensor : tensors) {
    const torch::Tensor moved = tensor.to(device);
    TORCH_CHECK(typeid(*tensor.unsafeGetTensorImpl()) == typeid(c10::TensorImpl) &&
                    typeid(*moved.unsafeGetTensorImpl()) == typeid(c10::TensorImpl),
                "only plain dense tensors can be moved in place");
    tensor.unsafeGetTensorImpl()->shallow_copy_from(moved.getIntrusivePtr());
  }
}

void run_checks(Runner& runner, const Library& library) {
  const int expected = expected_device_count();
  const auto device = [&](int index) { return torch::Device(library.name + ":" + std::to_string(index)); };
  const auto memory_allocated =
      reinterpret_cast<MemoryQuery>(dlsym(library.handle, "fulgor_emulated_memory_allocated"));
  const auto memory_peak = reinterpret_cast<MemoryQuery>(dlsym(library.handle, "fulgor_emulated_memory_peak"));
  const auto device_count = reinterpret_cast<CountQuery>(dlsym(library.handle, "fulgor_emulated_device_count"));

  runner.run("device count", [&]() -> std::string {
    if (device_count == nullptr) {
      return "fulgor_emulated_device_count is not exported";
    }
    const int guard_count = c10::impl::getDeviceGuardImpl(library.type)->deviceCount();
    if (guard_count != expected || device_count() != expected) {
      return "guard says " + std::to_string(guard_count) + ", library says " + std::to_string(device_count()) +
             ", expected " + std::to_string(expected);
    }
    return {};
  });

  if (expected < 2) {
    runner.run("the remaining checks", [] { return std::string("need FULGOR_EMULATED_DEVICE_COUNT of at least 2"); });
    return;
  }

  runner.run("tensors on index 0 and 1", [&]() -> std::string {
    for (int index : {0, 1}) {
      const torch::Tensor tensor = torch::empty({2}, device(index));
      if (tensor.device() != device(index)) {
        return "created on " + describe(device(index)) + " but reports " + describe(tensor.device());
      }
    }
    return {};
  });

  runner.run("index past the count is rejected", [&]() -> std::string {
    try {
      torch::empty({2}, torch::Device(library.type, static_cast<c10::DeviceIndex>(expected)));
    } catch (const c10::Error& error) {
      const std::string message = error.what();
      return message.find("does not exist") == std::string::npos
                 ? "unclear error: " + message.substr(0, message.find('\n'))
                 : std::string();
    }
    return "no error";
  });

  runner.run("memory statistics", [&]() -> std::string {
    if (memory_allocated == nullptr || memory_peak == nullptr) {
      return "memory statistics are not exported";
    }
    const int type = static_cast<int>(library.type);
    const int64_t before = memory_allocated(type, 1);
    int64_t during = 0;
    {
      const torch::Tensor tensor = torch::ones({1000}, device(1));
      during = memory_allocated(type, 1);
    }
    const int64_t after = memory_allocated(type, 1);
    if (during < before + 4000 || after != before || memory_peak(type, 1) < during) {
      return "allocated " + std::to_string(before) + " -> " + std::to_string(during) + " -> " + std::to_string(after) +
             ", peak " + std::to_string(memory_peak(type, 1));
    }
    if (memory_allocated(type, expected) != -1) {
      return "answers for a device that does not exist";
    }
    return {};
  });

  runner.run("CPU round trip", [&]() -> std::string {
    const torch::Tensor cpu = torch::arange(12, torch::kFloat).reshape({3, 4});
    const torch::Tensor on_device = cpu.to(device(1));
    if (on_device.device() != device(1)) {
      return "landed on " + describe(on_device.device());
    }
    const std::string contiguous = compare(on_device, cpu);
    return contiguous.empty() ? compare(cpu.t().to(device(1)), cpu.t()) : contiguous;
  });

  runner.run("MLP training step matches the CPU", [&]() -> std::string {
    torch::manual_seed(0);
    torch::nn::Sequential cpu_model = make_mlp();
    torch::nn::Sequential device_model(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(cpu_model->clone()));
    move_module(*device_model, device(1));
    const torch::Tensor input = torch::randn({5, 8});
    const torch::Tensor target = torch::randn({5, 4});

    const auto step = [](torch::nn::Sequential& model, const torch::Tensor& x, const torch::Tensor& y) {
      torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
      optimizer.zero_grad();
      torch::Tensor loss = torch::mse_loss(model->forward(x), y);
      loss.backward();
      optimizer.step();
      return loss.item<double>();
    };
    const double cpu_loss = step(cpu_model, input, target);
    const double device_loss = step(device_model, input.to(device(1)), target.to(device(1)));
    if (std::abs(cpu_loss - device_loss) > kTolerance) {
      return "loss " + describe(device_loss) + " instead of " + describe(cpu_loss);
    }
    const auto cpu_parameters = cpu_model->parameters();
    const auto device_parameters = device_model->parameters();
    for (std::size_t i = 0; i < cpu_parameters.size(); ++i) {
      const torch::Tensor& parameter = device_parameters[i];
      if (parameter.device() != device(1) || parameter.grad().device() != device(1)) {
        return "parameter " + std::to_string(i) + " or its gradient left " + describe(device(1));
      }
      const std::string difference = compare(parameter, cpu_parameters[i]);
      if (!difference.empty()) {
        return "parameter " + std::to_string(i) + ": " + difference;
      }
    }
    return {};
  });

  runner.run("sum().item", [&]() -> std::string {
    const float sum = torch::arange(10, torch::kFloat).to(device(1)).sum().item<float>();
    return sum == 45.0f ? std::string() : "sum is " + describe(sum);
  });

  runner.run("view aliases its input", [&]() -> std::string {
    const torch::Tensor tensor = torch::arange(12, torch::kFloat).to(device(1));
    const torch::Tensor view = tensor.view({3, 4});
    view.mul_(2);
    if (view.data_ptr() != tensor.data_ptr() || view.device() != device(1)) {
      return "view does not share memory on " + describe(device(1));
    }
    return compare(tensor, torch::arange(12, torch::kFloat) * 2);
  });

  runner.run("reshape", [&]() -> std::string {
    const torch::Tensor cpu = torch::arange(12, torch::kFloat).reshape({3, 4});
    const torch::Tensor on_device = cpu.to(device(1));
    const std::string contiguous = compare(on_device.reshape({2, 6}), cpu.reshape({2, 6}));
    return contiguous.empty() ? compare(on_device.t().reshape({12}), cpu.t().reshape({12})) : contiguous;
  });

  runner.run("index_select", [&]() -> std::string {
    const torch::Tensor cpu = torch::arange(12, torch::kFloat).reshape({3, 4});
    const torch::Tensor index = torch::tensor({2, 0}, torch::kLong);
    const torch::Tensor result = cpu.to(device(1)).index_select(1, index.to(device(1)));
    if (result.device() != device(1)) {
      return "result on " + describe(result.device());
    }
    return compare(result, cpu.index_select(1, index));
  });

  runner.run("cat", [&]() -> std::string {
    const torch::Tensor a = torch::ones({2, 3});
    const torch::Tensor b = torch::arange(6, torch::kFloat).reshape({2, 3});
    const torch::Tensor result = torch::cat({a.to(device(1)), b.to(device(1))}, 0);
    if (result.device() != device(1)) {
      return "result on " + describe(result.device());
    }
    return compare(result, torch::cat({a, b}, 0));
  });

  runner.run("randn", [&]() -> std::string {
    if (library.type != torch::kPrivateUse1) {
      // Random operators on xpu draw from the CPU's default generator.
      torch::manual_seed(7);
      const torch::Tensor on_device = torch::randn({16}, device(1));
      torch::manual_seed(7);
      if (on_device.device() != device(1)) {
        return "result on " + describe(on_device.device());
      }
      return compare(on_device, torch::randn({16}));
    }
    // npu has a generator per device, reached through its hooks.
    const auto seeded_randn = [&](int index) {
      at::Generator generator = at::globalContext().defaultGenerator(device(index));
      {
        std::lock_guard<std::mutex> lock(generator.mutex());
        generator.set_current_seed(7);
      }
      return torch::randn({16}, device(index));
    };
    torch::manual_seed(3);
    const torch::Tensor cpu_before = torch::randn({4});
    torch::manual_seed(3);
    const torch::Tensor first = seeded_randn(0);
    const torch::Tensor cpu_after = torch::randn({4});
    const torch::Tensor second = seeded_randn(1);
    if (first.device() != device(0) || second.device() != device(1)) {
      return "results on " + describe(first.device()) + " and " + describe(second.device());
    }
    if (!torch::equal(cpu_before, cpu_after)) {
      return "drew from the CPU generator";
    }
    if (torch::equal(first.cpu(), torch::zeros({16}))) {
      return "values are all zero";
    }
    return compare(second, first.cpu());
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[2]) != "xpu" && std::string(argv[2]) != "npu")) {
    std::cerr << "usage: " << argv[0] << " <emulated device library> <xpu|npu>\n";
    return EXIT_FAILURE;
  }
  Library library{dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL),
                  std::string(argv[2]) == "xpu" ? torch::kXPU : torch::kPrivateUse1, argv[2]};
  if (library.handle == nullptr) {
    std::cout << "FAIL load " << argv[1] << ": " << dlerror() << '\n';
    return EXIT_FAILURE;
  }
  std::cout << "PASS load " << argv[1] << '\n';
  Runner runner;
  run_checks(runner, library);
  return runner.finish();
}
