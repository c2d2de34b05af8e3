#include "checks.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fulgor/core/batch.h"
#include "fulgor/data/tensor_loader.h"
#include "fulgor/core/error.h"
#include "fulgor/module.h"
#include "fulgor/config/seed.h"
#include "fulgor/trainer.h"

namespace fulgor::conformance {
namespace {

// LibTorch's messages carry a backtrace on later lines.
std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  return what.substr(0, what.find('\n'));
}

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

// Every parameter and buffer, recursively, in a stable order.
Named state_of(torch::nn::Module& module) {
  Named state;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    state.emplace_back("parameter " + item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    state.emplace_back("buffer " + item.key(), item.value());
  return state;
}

// Fails unless `actual` lies on `device` and matches `expected` (a CPU tensor)
// within `tolerance`; integer tensors must match exactly.
void require_matches(const std::string& what, const torch::Tensor& actual, const torch::Tensor& expected,
                     torch::Device device, const Tolerance& tolerance) {
  if (!actual.defined()) fail(fmt::format("{} is undefined", what));
  if (actual.device() != device) fail(fmt::format("{} is on {}, not {}", what, actual.device().str(), device.str()));
  const torch::Tensor on_cpu = actual.detach().to(torch::kCPU);
  if (on_cpu.sizes() != expected.sizes() || on_cpu.scalar_type() != expected.scalar_type()) {
    std::ostringstream got, want;
    got << on_cpu.scalar_type() << on_cpu.sizes();
    want << expected.scalar_type() << expected.sizes();
    fail(fmt::format("{} is {} where the CPU has {}", what, got.str(), want.str()));
  }
  if (!on_cpu.is_floating_point()) {
    if (!torch::equal(on_cpu, expected)) fail(fmt::format("{} differs from the CPU", what));
    return;
  }
  if (!torch::allclose(on_cpu, expected, tolerance.rtol, tolerance.atol)) {
    const double error = (on_cpu - expected).abs().max().item<double>();
    fail(fmt::format("{} differs from the CPU by up to {:g}, beyond {:g} + {:g} * |cpu|", what, error, tolerance.atol,
                     tolerance.rtol));
  }
}

constexpr Tolerance kExact{0.0, 0.0};

// An MLP with a BatchNorm, so that the module has buffers as well as parameters.
torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 4));
}

torch::nn::Sequential make_cnn() {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3).padding(1)), torch::nn::ReLU(),
                               torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)), torch::nn::Flatten(),
                               torch::nn::Linear(4 * 4 * 4, 3));
}

torch::nn::Sequential copy_of(const torch::nn::Sequential& model) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
}

// ---- Devices ----------------------------------------------------------------

std::vector<torch::Device> parse(const Accelerator& accelerator, const Devices& value) {
  try {
    return accelerator.parse_devices(value);
  } catch (const std::exception& e) {
    fail(fmt::format("parse_devices({}) was rejected: {}", value.str(), first_line(e)));
  }
}

// Accelerators that address devices by index refuse more devices than they
// have; those whose `devices` counts processes on one device (the CPU) accept
// any number. The checks adapt to which one parse_devices shows.
bool counts_processes(const Accelerator& accelerator) {
  try {
    accelerator.parse_devices(accelerator.device_count() + 1);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void require_devices(const Accelerator& accelerator, const Devices& value, const std::vector<torch::Device>& devices,
                     size_t expected) {
  if (devices.size() != expected)
    fail(fmt::format("parse_devices({}) gives {} devices, expected {}", value.str(), devices.size(), expected));
  for (const torch::Device& device : devices) {
    if (device.type() != accelerator.device_type())
      fail(fmt::format("parse_devices({}) gives {}, which is not of the accelerator's device type {}", value.str(),
                       device.str(), c10::DeviceTypeName(accelerator.device_type(), /*lower_case=*/true)));
    if (device.has_index() && (device.index() < 0 || device.index() >= accelerator.device_count()))
      fail(fmt::format("parse_devices({}) gives {}, but device_count() is {}", value.str(), device.str(),
                       accelerator.device_count()));
  }
}

std::string check_device_count(const Accelerator& accelerator) {
  const Availability availability = accelerator.availability();
  if (!availability.reason.empty())
    fail(fmt::format("availability() says available but gives a reason: '{}'", availability.reason));
  const int64_t count = accelerator.device_count();
  if (count < 1) fail(fmt::format("available, but device_count() is {}", count));
  const int64_t auto_count = accelerator.auto_device_count();
  if (auto_count < 1 || auto_count > count)
    fail(fmt::format("auto_device_count() is {}, outside 1..device_count() = {}", auto_count, count));
  return fmt::format("{} device{}, \"auto\" uses {}", count, count == 1 ? "" : "s", auto_count);
}

std::string check_parse_devices(const Accelerator& accelerator) {
  const int64_t count = accelerator.device_count();
  require_devices(accelerator, "auto", parse(accelerator, "auto"),
                  static_cast<size_t>(accelerator.auto_device_count()));
  const std::vector<torch::Device> by_count = parse(accelerator, count);
  require_devices(accelerator, count, by_count, static_cast<size_t>(count));
  if (parse(accelerator, std::to_string(count)) != by_count)
    fail(fmt::format("parse_devices(\"{0}\") and parse_devices({0}) differ", count));

  if (counts_processes(accelerator)) {
    const std::vector<torch::Device> more = parse(accelerator, count + 1);
    require_devices(accelerator, count + 1, more, static_cast<size_t>(count + 1));
    for (const torch::Device& device : more)
      if (device != more.front())
        fail(fmt::format("parse_devices({}) counts processes but gives both {} and {}", count + 1, more.front().str(),
                         device.str()));
    return fmt::format("devices counts processes, all on {}", more.front().str());
  }

  for (size_t i = 0; i < by_count.size(); ++i)
    if (by_count[i].has_index() && by_count[i].index() != static_cast<int64_t>(i))
      fail(fmt::format("parse_devices({}) gives {} at position {}; a count selects the first devices, in order", count,
                       by_count[i].str(), i));
  require_devices(accelerator, -1, parse(accelerator, -1), static_cast<size_t>(count));
  const Devices last = std::vector<int64_t>{count - 1};
  const std::vector<torch::Device> by_index = parse(accelerator, last);
  require_devices(accelerator, last, by_index, 1);
  if (by_index[0].has_index() && by_index[0].index() != count - 1)
    fail(fmt::format("parse_devices({}) gives {}", last.str(), by_index[0].str()));
  return "devices are addressed by index";
}

std::string check_bad_devices(const Accelerator& accelerator) {
  const int64_t count = accelerator.device_count();
  std::vector<Devices> bad = {0, -2, "abc", "", "0,0", std::vector<int64_t>{}, std::vector<int64_t>{count}};
  if (!counts_processes(accelerator)) bad.emplace_back(count + 1);
  for (const Devices& value : bad) {
    try {
      const std::vector<torch::Device> devices = accelerator.parse_devices(value);
      fail(fmt::format("parse_devices({}) accepted it with {} devices instead of throwing ConfigError", value.str(),
                       devices.size()));
    } catch (const ConfigError& e) {
      if (std::string(e.what()).find(value.str()) == std::string::npos)
        fail(fmt::format("the ConfigError for devices={} does not name the value: {}", value.str(), e.what()));
    }
  }
  return fmt::format("{} values rejected", bad.size());
}

// ---- Moving data --------------------------------------------------------------

std::string check_move_module(const Accelerator& accelerator, torch::Device device) {
  torch::manual_seed(1);
  torch::nn::Sequential model = make_mlp();
  const Named before = state_of(*model);
  std::vector<torch::Tensor> values;
  for (const auto& item : before) values.push_back(item.second.detach().clone());

  accelerator.move_module(*model, device);

  const Named after = state_of(*model);
  if (after.size() != before.size())
    fail(fmt::format("the module had {} parameters and buffers, now {}", before.size(), after.size()));
  int parameters = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    const auto& [name, tensor] = after[i];
    if (tensor.unsafeGetTensorImpl() != before[i].second.unsafeGetTensorImpl())
      fail(fmt::format("{} was replaced by a new tensor; it must be moved in place, since optimizers hold it", name));
    require_matches(name, tensor, values[i], device, kExact);
    if (tensor.requires_grad() != before[i].second.requires_grad()) fail(fmt::format("{} changed requires_grad", name));
    parameters += tensor.requires_grad() ? 1 : 0;
  }
  return fmt::format("{} parameters, {} buffers", parameters, after.size() - static_cast<size_t>(parameters));
}

std::string check_move_batch(const Accelerator& accelerator, torch::Device device) {
  const torch::Tensor x = torch::arange(12, torch::kFloat).reshape({3, 4});
  const torch::Tensor y = torch::arange(3, torch::kLong);
  require_matches("a tensor", move_batch(x, accelerator, device), x, device, kExact);
  require_matches("a transposed tensor", move_batch(x.t(), accelerator, device), x.t(), device, kExact);

  const auto example = move_batch(torch::data::Example<>(x, y), accelerator, device);
  require_matches("Example::data", example.data, x, device, kExact);
  require_matches("Example::target", example.target, y, device, kExact);

  const auto tuple = move_batch(std::make_tuple(x, y, int64_t{7}), accelerator, device);
  require_matches("tuple element 0", std::get<0>(tuple), x, device, kExact);
  require_matches("tuple element 1", std::get<1>(tuple), y, device, kExact);
  if (std::get<2>(tuple) != 7) fail("a number in a tuple changed");

  const auto vector = move_batch(std::vector<torch::Tensor>{x, y}, accelerator, device);
  require_matches("vector element 0", vector.at(0), x, device, kExact);
  require_matches("vector element 1", vector.at(1), y, device, kExact);

  const auto map = move_batch(std::map<std::string, torch::Tensor>{{"x", x}, {"y", y}}, accelerator, device);
  require_matches("map value \"x\"", map.at("x"), x, device, kExact);
  require_matches("map value \"y\"", map.at("y"), y, device, kExact);
  return "tensor, Example, tuple, vector, map";
}

// ---- Computing like the CPU ---------------------------------------------------

using LossFunction = torch::Tensor (*)(const torch::Tensor&, const torch::Tensor&);

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) { return torch::mse_loss(output, target); }
torch::Tensor cross_entropy(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(output, target);
}

constexpr int kSteps = 2;

// Everything the CPU and the device must agree on while training: the first
// forward output and gradients, each step's loss, and the final parameters and
// buffers (SGD with momentum, so optimizer state is exercised too).
Named train(torch::nn::Sequential& model, const torch::Tensor& input, const torch::Tensor& target,
            LossFunction loss_of) {
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Named trace;
  for (int step = 1; step <= kSteps; ++step) {
    optimizer.zero_grad();
    const torch::Tensor output = model->forward(input);
    const torch::Tensor loss = loss_of(output, target);
    loss.backward();
    if (step == 1) {
      trace.emplace_back("the forward output", output.detach());
      for (const auto& item : model->named_parameters())
        trace.emplace_back("the gradient of " + item.key(),
                           item.value().grad().defined() ? item.value().grad().clone() : torch::Tensor());
    }
    trace.emplace_back(fmt::format("the loss at step {}", step), loss.detach());
    optimizer.step();
  }
  for (const auto& [name, tensor] : state_of(*model))
    trace.emplace_back(fmt::format("{} after {} SGD steps", name, kSteps), tensor.detach().clone());
  return trace;
}

std::string check_training_step(const Accelerator& accelerator, torch::Device device, const Tolerance& tolerance,
                                torch::nn::Sequential (*make)(), const torch::Tensor& input,
                                const torch::Tensor& target, LossFunction loss_of) {
  torch::nn::Sequential on_cpu = make();
  torch::nn::Sequential on_device = copy_of(on_cpu);
  accelerator.move_module(*on_device, device);
  const auto batch = move_batch(torch::data::Example<>(input, target), accelerator, device);

  const Named expected = train(on_cpu, input, target, loss_of);
  const Named actual = train(on_device, batch.data, batch.target, loss_of);
  for (size_t i = 0; i < expected.size(); ++i)
    require_matches(actual[i].first, actual[i].second, expected[i].second, device, tolerance);
  return fmt::format("forward, backward and {} SGD steps", kSteps);
}

std::string check_mlp(const Accelerator& accelerator, torch::Device device, const Tolerance& tolerance) {
  torch::manual_seed(2);
  const torch::Tensor input = torch::randn({6, 8});
  const torch::Tensor target = torch::randn({6, 4});
  return check_training_step(accelerator, device, tolerance, &make_mlp, input, target, &mse);
}

std::string check_cnn(const Accelerator& accelerator, torch::Device device, const Tolerance& tolerance) {
  torch::manual_seed(3);
  const torch::Tensor input = torch::randn({4, 2, 8, 8});
  const torch::Tensor target = torch::randint(0, 3, {4}, torch::kLong);
  return check_training_step(accelerator, device, tolerance, &make_cnn, input, target, &cross_entropy);
}

// ---- The Trainer's training loop ----------------------------------------------

// A tiny MLP that records each step's loss on the host.
struct LossRecorder : Module {
  torch::nn::Sequential mlp{nullptr};
  std::vector<double> losses;

  LossRecorder() {
    mlp = register_module("mlp",
                          torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4)));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    const torch::Tensor loss = torch::mse_loss(mlp->forward(batch.data), batch.target);
    losses.push_back(loss.detach().to(torch::kCPU).item<double>());
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
};

constexpr int64_t kFitEpochs = 2;
constexpr int64_t kFitBatches = 4;

// Fits a freshly seeded LossRecorder through the Trainer for kFitEpochs epochs
// of kFitBatches shuffled batches (shared among the ranks of a job), on
// `devices` or at the Trainer's default.
std::unique_ptr<LossRecorder> fit(const std::string& accelerator, std::optional<Devices> devices,
                                  DefaultsFit* run = nullptr) {
  auto g = at::detail::createCPUGenerator(8);
  const torch::Tensor input = torch::randn({kFitBatches * 6, 8}, g);
  const torch::Tensor target = torch::randn({kFitBatches * 6, 4}, g);
  TensorLoaderOptions loader_options;
  loader_options.batch_size = 6;
  loader_options.shuffle = true;
  loader_options.seed = 9;
  TensorLoader loader(input, target, loader_options);

  torch::manual_seed(10);
  auto model = std::make_unique<LossRecorder>();
  TrainerOptions options;
  options.accelerator = accelerator;
  if (devices) options.devices = std::move(*devices);
  options.max_epochs = kFitEpochs;
  options.logger = false;
  options.enable_checkpointing = false;
  options.enable_progress_bar = false;
  options.enable_model_summary = false;
  Trainer trainer(options);
  trainer.fit(*model, loader);
  if (run) *run = {trainer.world_size(), trainer.is_global_zero(), model->losses.size(), model->losses.back()};
  return model;
}

std::string check_fit(const Accelerator& accelerator, torch::Device device, const Tolerance& tolerance) {
  const auto expected = fit("cpu", 1);
  const auto actual =
      fit(accelerator.name(), device.has_index() ? Devices(std::vector<int64_t>{device.index()}) : Devices(1));
  if (actual->losses.size() != expected->losses.size())
    fail(fmt::format("the fit took {} steps where the CPU took {}", actual->losses.size(), expected->losses.size()));
  for (size_t i = 0; i < expected->losses.size(); ++i) {
    const double got = actual->losses[i], want = expected->losses[i];
    if (!(std::abs(got - want) <= tolerance.atol + tolerance.rtol * std::abs(want)))
      fail(fmt::format("the loss at step {} is {:g} where the CPU has {:g}", i + 1, got, want));
  }
  const Named actual_state = state_of(*actual), expected_state = state_of(*expected);
  for (size_t i = 0; i < expected_state.size(); ++i)
    require_matches(actual_state[i].first + " after the fit", actual_state[i].second, expected_state[i].second, device,
                    tolerance);
  return fmt::format("{} epochs x {} batches through fulgor::Trainer", kFitEpochs, kFitBatches);
}

}  // namespace

DefaultsFit fit_at_defaults(const std::string& accelerator) {
  DefaultsFit run;
  fit(accelerator, std::nullopt, &run);
  return run;
}

int64_t steps_at_defaults(int64_t world_size) {
  const int64_t samples_per_rank = (kFitBatches * 6 + world_size - 1) / world_size;
  return kFitEpochs * ((samples_per_rank + 5) / 6);
}

namespace {

// ---- State, RNG, execution and memory -----------------------------------------

std::string check_state_dict(const Accelerator& accelerator, torch::Device device) {
  torch::manual_seed(4);
  torch::nn::Sequential source = make_mlp();
  accelerator.move_module(*source, device);
  {
    // Buffers away from their initial values, so a load that skipped them shows.
    torch::NoGradGuard no_grad;
    for (const auto& buffer : source->buffers()) buffer.add_(1);
  }
  std::stringstream saved;
  torch::save(source, saved);

  torch::manual_seed(5);
  torch::nn::Sequential on_cpu = make_mlp();
  torch::load(on_cpu, saved, torch::Device(torch::kCPU));
  const Named source_state = state_of(*source);
  const Named cpu_state = state_of(*on_cpu);
  for (size_t i = 0; i < cpu_state.size(); ++i)
    require_matches(cpu_state[i].first + " loaded on the CPU", cpu_state[i].second,
                    source_state[i].second.detach().to(torch::kCPU), torch::Device(torch::kCPU), kExact);

  std::stringstream resaved;
  torch::save(on_cpu, resaved);
  torch::manual_seed(6);
  torch::nn::Sequential back = make_mlp();
  accelerator.move_module(*back, device);
  const Named before = state_of(*back);
  torch::load(back, resaved, device);
  const Named after = state_of(*back);
  for (size_t i = 0; i < after.size(); ++i) {
    if (after[i].second.unsafeGetTensorImpl() != before[i].second.unsafeGetTensorImpl())
      fail(fmt::format("loading replaced {} instead of filling it in", after[i].first));
    require_matches(after[i].first + " loaded back on the device", after[i].second, cpu_state[i].second, device,
                    kExact);
  }
  return "saved on the device, loaded on the CPU and back";
}

std::string check_rng_state(const Accelerator& accelerator, torch::Device device) {
  const torch::Tensor state = accelerator.get_rng_state(device);
  if (!state.defined()) {
    // Restoring "no state" must be accepted, since that is what a checkpoint holds.
    accelerator.set_rng_state(device, state);
    return "no generator of its own: get_rng_state gives an undefined tensor";
  }
  const torch::TensorOptions on_device = torch::TensorOptions().device(device);
  const torch::Tensor first = torch::rand({16}, on_device).to(torch::kCPU);
  if (torch::equal(accelerator.get_rng_state(device), state))
    fail("drawing random numbers on the device did not change get_rng_state");
  accelerator.set_rng_state(device, state);
  const torch::Tensor again = torch::rand({16}, on_device).to(torch::kCPU);
  if (!torch::equal(first, again)) fail("after set_rng_state, torch::rand drew different numbers");
  return "get, draw, set, draw again";
}

// Two draws on the device after seeding with the same seed must be equal, and
// one after another seed must differ. A device with a generator of its own is
// seeded by manual_seed alone (a CPU-backed accelerator's is the CPU's); one
// without draws from where its runtime takes numbers, which the Trainer's
// seed reaches only through the CPU's generator, so it is seeded as the
// Trainer seeds it.
std::string check_manual_seed(const Accelerator& accelerator, torch::Device device) {
  const bool own_generator = accelerator.get_rng_state(device).defined();
  const auto draw = [&](uint64_t seed) {
    if (own_generator)
      accelerator.manual_seed(seed);
    else
      seed_accelerator(accelerator, seed);
    return torch::rand({16}, torch::TensorOptions().device(device)).to(torch::kCPU);
  };
  const torch::Tensor first = draw(11);
  if (!torch::equal(draw(11), first)) fail("two draws after seeding with 11 differ");
  if (torch::equal(draw(12), first)) fail("a draw after seeding with 12 is the one seeding with 11 gave");
  return own_generator ? "seeds the device's generator"
                       : "no generator of its own: draws repeat when the CPU's generator is seeded too";
}

std::string check_synchronize(const Accelerator& accelerator, torch::Device device) {
  const torch::Tensor host = torch::arange(4096, torch::kFloat);
  const torch::Tensor moved = move_batch(host, accelerator, device, /*non_blocking=*/true);
  accelerator.synchronize(device);
  require_matches("a tensor copied with non_blocking", moved, host, device, kExact);
  return "after a non-blocking copy";
}

std::string check_memory_stats(const Accelerator& accelerator, torch::Device device) {
  const std::map<std::string, int64_t> stats = accelerator.memory_stats(device);
  for (const auto& [name, value] : stats) {
    if (name.empty()) fail("a statistic has an empty name");
    if (value < 0) fail(fmt::format("{} is negative: {}", name, value));
  }
  return fmt::format("{} statistic{}", stats.size(), stats.size() == 1 ? "" : "s");
}

// Out-of-memory errors as BatchSizeFinder meets them: LibTorch's own type,
// which caching allocators throw, and not an error of another kind.
std::string check_is_out_of_memory(const Accelerator& accelerator) {
  try {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "Tried to allocate 1 TiB");
  } catch (const std::exception& e) {
    if (!accelerator.is_out_of_memory(e)) fail("is_out_of_memory does not recognise c10::OutOfMemoryError");
  }
  try {
    TORCH_CHECK(false, "mat1 and mat2 shapes cannot be multiplied");
  } catch (const std::exception& e) {
    if (accelerator.is_out_of_memory(e)) fail("is_out_of_memory takes a shape error for an out-of-memory error");
  }
  if (accelerator.is_out_of_memory(std::invalid_argument("bad batch")))
    fail("is_out_of_memory takes std::invalid_argument for an out-of-memory error");
  return "c10::OutOfMemoryError, and no other error";
}

// The Trainer's `benchmark`: set_benchmark answers the same for either
// value, as an accelerator has kernel autotuning or has not, and never throws.
// Where it has, LibTorch's cuDNN flag is put back as it was.
std::string check_set_benchmark(const Accelerator& accelerator) {
  const bool before = at::globalContext().benchmarkCuDNN();
  const bool on = accelerator.set_benchmark(true), off = accelerator.set_benchmark(false);
  accelerator.set_benchmark(before);
  if (on != off) fail(fmt::format("set_benchmark(true) answers {}, set_benchmark(false) {}", on, off));
  return on ? "kernel autotuning set" : "no kernel autotuning: nothing set";
}

}  // namespace

void Report::check(const std::string& name, const std::function<std::string()>& body) {
  std::string failure;
  std::string note;
  try {
    note = body();
  } catch (const CheckFailure& e) {
    failure = e.what();
  } catch (const std::exception& e) {
    failure = "threw: " + first_line(e);
  }
  if (failure.empty()) {
    ++passed_;
    std::cout << "PASS " << name << (note.empty() ? "" : " (" + note + ")") << std::endl;
  } else {
    ++failed_;
    std::cout << "FAIL " << name << ": " << failure << std::endl;
  }
}

void run_checks(Accelerator& accelerator, const Options& options, Report& report) {
  const Accelerator& a = accelerator;
  const Availability availability = a.availability();
  report.check("availability", [&] {
    if (!availability.available) fail(availability.reason);
    return std::string();
  });
  if (!availability.available) return;
  report.check("device_count", [&] { return check_device_count(a); });
  report.check("parse_devices", [&] { return check_parse_devices(a); });
  report.check("bad_devices", [&] { return check_bad_devices(a); });
  report.check("is_out_of_memory", [&] { return check_is_out_of_memory(a); });
  report.check("set_benchmark", [&] { return check_set_benchmark(a); });

  // The per-device checks run once on every distinct device selected.
  std::vector<torch::Device> devices;
  report.check("devices " + options.devices.str(), [&] {
    std::string listed;
    for (const torch::Device& device : a.parse_devices(options.devices)) {
      if (std::find(devices.begin(), devices.end(), device) != devices.end()) continue;
      devices.push_back(device);
      listed += (listed.empty() ? "" : ", ") + device.str();
    }
    return listed;
  });

  const Tolerance& tolerance = options.tolerance;
  for (const torch::Device& device : devices) {
    const std::string on = " on " + device.str();
    report.check("setup_device" + on, [&] {
      accelerator.setup_device({device});
      return std::string();
    });
    report.check("move_module" + on, [&] { return check_move_module(a, device); });
    report.check("move_batch" + on, [&] { return check_move_batch(a, device); });
    report.check("mlp_training_step" + on, [&] { return check_mlp(a, device, tolerance); });
    report.check("cnn_training_step" + on, [&] { return check_cnn(a, device, tolerance); });
    report.check("state_dict" + on, [&] { return check_state_dict(a, device); });
    report.check("rng_state" + on, [&] { return check_rng_state(a, device); });
    report.check("manual_seed" + on, [&] { return check_manual_seed(a, device); });
    report.check("synchronize" + on, [&] { return check_synchronize(a, device); });
    report.check("memory_stats" + on, [&] { return check_memory_stats(a, device); });
    report.check("fit" + on, [&] { return check_fit(a, device, tolerance); });
  }
  report.check("fit_at_defaults", [&] { return check_fit_at_defaults(a, options.command); });

  report.check("teardown", [&] {
    accelerator.teardown();
    return std::string();
  });
}

}  // namespace fulgor::conformance
