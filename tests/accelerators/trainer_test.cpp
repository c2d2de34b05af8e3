// fulgor::Trainer on the built-in xpu and npu accelerators, over the emulated
// runtimes, and on CUDA where the machine has it: a short fit on a device must
// train as the same fit on the CPU does, and checkpoints must move between
// each device and the CPU.

#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "../support/tiny.h"
#include "emulated_runtimes.h"
#include "fulgor/detail/compat.h"
#include "fulgor/fulgor.h"

namespace fulgor {
namespace {

using testing::kNpu1;
using testing::kXpu1;

// The emulated runtimes compute with the CPU's kernels, so the two fits could
// even match exactly; the tolerance is what a real device's kernels would need
// on this float32 model, tight enough that one wrong step shows.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

// An optimizer of the user's own (plain momentum), whose state type the
// Trainer knows nothing of: resuming must still move its state.
struct HeavyBallOptions : torch::optim::OptimizerCloneableOptions<HeavyBallOptions> {
  explicit HeavyBallOptions(double lr = 0.05) : lr_(lr) {}
  double get_lr() const override { return lr(); }
  void set_lr(const double value) override { lr(value); }
  void serialize(torch::serialize::OutputArchive& archive) const override { archive.write("lr", c10::IValue(lr())); }
  void serialize(torch::serialize::InputArchive& archive) override {
    c10::IValue value;
    archive.read("lr", value);
    lr(value.toDouble());
  }
  TORCH_ARG(double, lr);
};

struct HeavyBallState : torch::optim::OptimizerCloneableParamState<HeavyBallState> {
  void serialize(torch::serialize::OutputArchive& archive) const override { archive.write("velocity", velocity(), true); }
  void serialize(torch::serialize::InputArchive& archive) override {
    torch::Tensor value;
    archive.read("velocity", value, true);
    velocity(value);
  }
  TORCH_ARG(torch::Tensor, velocity);
};

// The key of a parameter's state, whose type differs between LibTorch versions.
template <typename Key>
Key state_key(c10::TensorImpl* parameter) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // as c10::guts::to_string, which 2.x no longer has
    text << parameter;
    return text.str();
  } else {
    return parameter;
  }
}

class HeavyBall : public torch::optim::Optimizer {
 public:
  HeavyBall(std::vector<torch::Tensor> params, const HeavyBallOptions& options)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))}, std::make_unique<HeavyBallOptions>(options)) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss = closure ? closure() : torch::Tensor();
    for (auto& group : param_groups()) {
      const double lr = static_cast<HeavyBallOptions&>(group.options()).lr();
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = state()[state_key<std::decay_t<decltype(state())>::key_type>(p.unsafeGetTensorImpl())];
        if (!slot) {
          auto fresh = std::make_unique<HeavyBallState>();
          fresh->velocity(torch::zeros_like(p));
          slot = std::move(fresh);
        }
        torch::Tensor velocity = static_cast<HeavyBallState&>(*slot).velocity();
        EXPECT_EQ(velocity.device(), p.device()) << "the optimizer state is not on its parameter's device";
        velocity.mul_(0.9).add_(p.grad());
        p.add_(velocity, -lr);
      }
    }
    return loss;
  }
  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<HeavyBallState, HeavyBallOptions>(archive, *this);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<HeavyBallState, HeavyBallOptions>(archive, *this);
  }
};

// Records each step's loss, read back on the host.
struct TinyRegression : Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  std::vector<double> losses;
  std::string optimizer;  // "SGD" (with momentum), "Adam", "AdamW", "RMSprop", "Adagrad" or "HeavyBall"

  explicit TinyRegression(std::string optimizer_name) : optimizer(std::move(optimizer_name)) {
    l1 = register_module("l1", torch::nn::Linear(4, 8));
    l2 = register_module("l2", torch::nn::Linear(8, 1));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    const torch::Tensor loss = torch::mse_loss(l2(torch::tanh(l1(batch.data))), batch.target);
    losses.push_back(loss.detach().to(torch::kCPU).item<double>());
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    if (optimizer == "Adam") return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01));
    if (optimizer == "AdamW")
      return std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(0.01));
    if (optimizer == "RMSprop")
      return std::make_shared<torch::optim::RMSprop>(parameters(),
                                                     torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
    if (optimizer == "Adagrad")
      return std::make_shared<torch::optim::Adagrad>(parameters(), torch::optim::AdagradOptions(0.05));
    if (optimizer == "HeavyBall") return std::make_shared<HeavyBall>(parameters(), HeavyBallOptions(0.05));
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
};

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::path(::testing::TempDir()) /
           ("fulgor_accelerator_trainer_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

TrainerOptions quiet(const std::string& accelerator, Devices devices, int64_t epochs, const TempDir& dir) {
  TrainerOptions o;
  o.accelerator = accelerator;
  o.devices = std::move(devices);
  o.max_epochs = epochs;
  o.logger = false;
  o.enable_checkpointing = false;
  o.enable_progress_bar = false;
  o.enable_model_summary = false;
  o.default_root_dir = dir.path.string();
  return o;
}

// 4 batches of 8 per epoch, shuffled by epoch.
TensorLoader regression_loader() {
  auto g = at::detail::createCPUGenerator(3);
  const torch::Tensor x = torch::randn({32, 4}, g);
  const torch::Tensor y = x.sum(1, true) * 0.5 + 0.1 * torch::randn({32, 1}, g);
  TensorLoaderOptions options;
  options.batch_size = 8;
  options.shuffle = true;
  options.seed = 11;
  return TensorLoader(x, y, options);
}

std::unique_ptr<TinyRegression> tiny_model(const std::string& optimizer = "SGD") {
  torch::manual_seed(17);
  return std::make_unique<TinyRegression>(optimizer);
}

void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, double rtol = kRtol,
                  double atol = kAtol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], atol + rtol * std::abs(expected[i])) << "step " << i;
}

void expect_close(torch::nn::Module& actual, torch::nn::Module& expected, double rtol = kRtol, double atol = kAtol) {
  const auto a = actual.named_parameters(), e = expected.named_parameters();
  ASSERT_EQ(a.size(), e.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const torch::Tensor on_cpu = a[i].value().detach().to(torch::kCPU);
    EXPECT_TRUE(torch::allclose(on_cpu, e[i].value(), rtol, atol))
        << a[i].key() << " differs by " << (on_cpu - e[i].value()).abs().max().item<double>();
  }
}

// LibTorch's autograd engine sizes its per-device queues once, at the first
// backward pass of the process: a runtime loaded after a CPU backward has run
// cannot take part in autograd. So the tests load it before anything trains.
void load_runtime(const std::string& name) { ASSERT_TRUE(make_accelerator(name)->is_available()) << name; }

// Trains the same model on the CPU and on `device` (given to the Trainer as
// accelerator `name` with devices={device's index}) and compares them.
void fit_matches_the_cpu(const std::string& name, torch::Device device, double rtol = kRtol, double atol = kAtol) {
  load_runtime(name);
  TempDir dir;
  auto on_cpu = tiny_model();
  auto cpu_loader = regression_loader();
  Trainer cpu_trainer(quiet("cpu", 1, 2, dir));
  cpu_trainer.fit(*on_cpu, cpu_loader);
  ASSERT_EQ(on_cpu->losses.size(), 8u);

  auto on_device = tiny_model();
  auto device_loader = regression_loader();
  Trainer device_trainer(quiet(name, std::vector<int64_t>{device.index()}, 2, dir));
  const FitResult result = device_trainer.fit(*on_device, device_loader);
  EXPECT_EQ(result.global_step, 8);
  EXPECT_EQ(device_trainer.device(), device);
  for (const torch::Tensor& p : on_device->parameters()) EXPECT_EQ(p.device(), device);
  // Training changed the model, so agreeing is not agreeing on the initial values.
  EXPECT_LT(on_cpu->losses.back(), on_cpu->losses.front());
  expect_close(on_device->losses, on_cpu->losses, rtol, atol);
  expect_close(*on_device, *on_cpu, rtol, atol);
}

// The same, with the device's loader behind an unbound DevicePrefetcher given
// to the Trainer, which binds it to its device. Returns whether the prefetcher
// asked its TensorLoader for pinned batches.
bool prefetched_fit_matches_the_cpu(const std::string& name, torch::Device device, double rtol = kRtol,
                                    double atol = kAtol) {
  TempDir dir;
  auto on_cpu = tiny_model();
  auto cpu_loader = regression_loader();
  Trainer(quiet("cpu", 1, 2, dir)).fit(*on_cpu, cpu_loader);

  auto on_device = tiny_model();
  auto device_loader = regression_loader();
  DevicePrefetcher prefetched(device_loader);
  Trainer device_trainer(quiet(name, std::vector<int64_t>{device.index()}, 2, dir));
  EXPECT_EQ(device_trainer.fit(*on_device, prefetched).global_step, 8);
  EXPECT_EQ(device_trainer.num_training_batches(), 4);
  expect_close(on_device->losses, on_cpu->losses, rtol, atol);
  expect_close(*on_device, *on_cpu, rtol, atol);
  return device_loader.options().pin_memory;
}

// Why the emulated xpu cannot train in this LibTorch, or "" where it can (Note
// [Emulated xpu beside CUDA] in tests/support/CMakeLists.txt).
std::string xpu_cannot_train() {
  return FULGOR_TORCH_HAS_CUDA ? "this LibTorch is built with CUDA, whose autograd engine takes CUDA's streams for "
                                 "XPU tensors too, so the emulated xpu cannot train in it"
                               : "";
}

TEST(XpuTrainer, FitOnDeviceOneMatchesTheCpu) {
  if (const std::string why = xpu_cannot_train(); !why.empty()) GTEST_SKIP() << why;
  fit_matches_the_cpu("xpu", kXpu1);
}

TEST(XpuTrainer, BindsAPrefetcherToItsDevice) {
  if (const std::string why = xpu_cannot_train(); !why.empty()) GTEST_SKIP() << why;
  load_runtime("xpu");
  EXPECT_FALSE(prefetched_fit_matches_the_cpu("xpu", kXpu1)) << "pinned batches for a device without pinned memory";
}

// Fabric's setup moves a module onto the device unless told not to
// (Lightning's move_to_device=False), on a device that is not the CPU.
TEST(XpuFabric, SetupModuleMovesOnlyWhenAsked) {
  if (const std::string why = xpu_cannot_train(); !why.empty()) GTEST_SKIP() << why;
  load_runtime("xpu");
  Fabric fabric({.accelerator = "xpu", .devices = std::vector<int64_t>{kXpu1.index()}});
  auto moved = torch::nn::Linear(2, 2), kept = torch::nn::Linear(2, 2);
  fabric.setup_module(*moved);
  fabric.setup_module(*kept, /*move_to_device=*/false);
  EXPECT_EQ(moved->weight.device(), kXpu1);
  EXPECT_EQ(kept->weight.device(), torch::Device(torch::kCPU));
}

TEST(NpuTrainer, FitOnDeviceOneMatchesTheCpu) {
  if (!detail::compat::kHasNamedPrivateUse1)
    GTEST_SKIP() << "the npu accelerator needs LibTorch >= 2.1, where PrivateUse1 can be named \"npu\"; this is "
                 << TORCH_VERSION;
  fit_matches_the_cpu("npu", kNpu1);
}

// CUDA's kernels round differently from the CPU's (other summation orders);
// one wrong step (a change of about 1e-2 at this learning rate) still shows.
constexpr double kCudaRtol = 1e-4;
constexpr double kCudaAtol = 1e-5;
const torch::Device kCuda0(torch::kCUDA, 0);

TEST(CudaTrainer, FitMatchesTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "this machine has no CUDA device";
  fit_matches_the_cpu("cuda", kCuda0, kCudaRtol, kCudaAtol);
}

// A TensorLoader behind a prefetcher bound to CUDA makes its batches in pinned
// memory, whose copies to the device are asynchronous.
TEST(CudaTrainer, PrefetchesPinnedBatches) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "this machine has no CUDA device";
  EXPECT_TRUE(prefetched_fit_matches_the_cpu("cuda", kCuda0, kCudaRtol, kCudaAtol)) << "no pinned batches";
}

// Reads of the emulated xpu's memory from the host so far (Note [Host
// reads] in emulated_device.cpp).
int64_t xpu_host_reads() {
  void* library = dlopen(FULGOR_EMULATED_XPU_LIBRARY, RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(library, nullptr) << "the emulated xpu runtime is not loaded";
  if (library == nullptr) return -1;
  using Count = int64_t (*)();
  const auto count = reinterpret_cast<Count>(dlsym(library, "fulgor_emulated_host_reads"));
  dlclose(library);
  return count ? count() : -1;
}

// Logs its loss each step, as the device tensor it is or as a number read
// with item(); keeps nothing else of it.
struct LoggingRegression : Module {
  torch::nn::Linear linear{nullptr};
  bool as_number;

  explicit LoggingRegression(bool number) : as_number(number) {
    torch::manual_seed(5);
    linear = register_module("linear", torch::nn::Linear(4, 1));
  }
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    torch::Tensor loss = torch::mse_loss(linear(batch.data), batch.target);
    LogOptions options;
    options.prog_bar = true;
    options.on_step = options.on_epoch = true;
    if (as_number)
      log("loss", loss.item<double>(), options);
    else
      log("loss", loss, options);
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05));
  }
};

// Host reads during a 3-epoch fit of LoggingRegression on xpu:1 (4 steps an
// epoch, logs due every 4th step), and what its logger got.
std::pair<int64_t, std::shared_ptr<testing::RecordingLogger>> fit_logging_on_xpu(bool as_number) {
  TempDir dir;
  auto model = std::make_shared<LoggingRegression>(as_number);
  auto loader = regression_loader();
  auto logger = std::make_shared<testing::RecordingLogger>();
  auto options = quiet("xpu", Devices(std::vector<int64_t>{1}), 3, dir);
  options.loggers = {logger};
  options.log_every_n_steps = 4;
  Trainer trainer(options);
  const int64_t before = xpu_host_reads();
  trainer.fit(*model, loader);
  return {xpu_host_reads() - before, logger};
}

// Note [Deferred reads]: a loss logged as a device tensor is read once per
// due step and once per epoch end, not at every step, and the loggers get
// the same values as when the module reads each one itself.
TEST(XpuTrainer, LoggingADeviceTensorReadsItOnlyWhenLogsAreDue) {
  if (const std::string why = xpu_cannot_train(); !why.empty()) GTEST_SKIP() << why;
  load_runtime("xpu");
  const auto [deferred_reads, deferred] = fit_logging_on_xpu(false);
  const auto [item_reads, immediate] = fit_logging_on_xpu(true);
  EXPECT_GE(item_reads, 12) << "one item() per step at least: the count misses reads";
  EXPECT_LE(deferred_reads, 3 + 3) << "3 due steps and 3 epoch ends";
  EXPECT_GE(deferred->calls.size(), 6u) << "step and epoch values";
  ASSERT_EQ(deferred->calls.size(), immediate->calls.size());
  for (size_t i = 0; i < immediate->calls.size(); ++i) {
    EXPECT_EQ(deferred->calls[i].first, immediate->calls[i].first);
    EXPECT_EQ(deferred->calls[i].second, immediate->calls[i].second) << "record " << i;
  }
}

// The Trainer's defaults show the logged loss on the progress bar: the bar
// reads it when it draws a line, not at every step. 3 epochs of 16 steps,
// a line every quarter of an epoch and at its end, logs due every 8th step.
TEST(XpuTrainer, TheProgressBarReadsLoggedValuesOnlyForItsLines) {
  if (const std::string why = xpu_cannot_train(); !why.empty()) GTEST_SKIP() << why;
  load_runtime("xpu");
  TempDir dir;
  auto model = std::make_shared<LoggingRegression>(false);
  auto g = at::detail::createCPUGenerator(3);
  const torch::Tensor x = torch::randn({128, 4}, g);
  TensorLoaderOptions loader_options;
  loader_options.batch_size = 8;
  TensorLoader loader(x, x.sum(1, true), loader_options);
  std::ostringstream lines;
  auto options = quiet("xpu", Devices(std::vector<int64_t>{1}), 3, dir);
  options.loggers = {std::make_shared<testing::RecordingLogger>()};
  options.log_every_n_steps = 8;
  options.enable_progress_bar = true;
  options.callbacks = {std::make_shared<ProgressBar>(&lines, /*refresh_lines=*/25, /*terminal=*/false, 0.0)};
  Trainer trainer(options);
  const int64_t before = xpu_host_reads();
  trainer.fit(*model, loader);
  const int64_t reads = xpu_host_reads() - before;
  const std::string text = lines.str();
  const auto drawn = static_cast<int64_t>(std::count(text.begin(), text.end(), '\n'));
  EXPECT_GE(drawn, 3 * 4) << text;
  EXPECT_NE(text.find("loss_step="), std::string::npos) << text;
  // Each line, due step and epoch end may read once; the 48 steps do not.
  EXPECT_LE(reads, drawn + 3 * 2 + 3) << text;
  EXPECT_LT(reads, 48);
}

// ---- Seeds and memory statistics on the devices ------------------------------

// TinyRegression with dropout on its hidden layer: every step draws random
// numbers on the device.
struct DropoutRegression : TinyRegression {
  DropoutRegression() : TinyRegression("SGD") {}
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    const torch::Tensor hidden = torch::dropout(torch::tanh(l1(batch.data)), 0.5, is_training());
    const torch::Tensor loss = torch::mse_loss(l2(hidden), batch.target);
    losses.push_back(loss.detach().to(torch::kCPU).item<double>());
    return loss;
  }
};

// The losses of one epoch of DropoutRegression on `device` under the
// Trainer's `seed`, from the same initial weights every time.
std::vector<double> seeded_dropout_fit(const std::string& name, torch::Device device, uint64_t seed) {
  TempDir dir;
  torch::manual_seed(17);
  DropoutRegression model;
  auto loader = regression_loader();
  TrainerOptions options = quiet(name, std::vector<int64_t>{device.index()}, 1, dir);
  options.seed = seed;
  Trainer(options).fit(model, loader);
  return model.losses;
}

// The Trainer's seed reaches the generator the device draws from, whichever
// it is: the fits would differ otherwise, as each moves that generator on.
void seed_decides_dropout_on(const std::string& name, torch::Device device) {
  load_runtime(name);
  const std::vector<double> first = seeded_dropout_fit(name, device, 5);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(seeded_dropout_fit(name, device, 5), first);
  EXPECT_NE(seeded_dropout_fit(name, device, 6), first);
}

// seed_everything before a module is built makes weights initialised on the
// device repeat.
void seed_everything_decides_initialisation_on(const std::string& name, torch::Device device) {
  load_runtime(name);
  const auto initialised = [&](uint64_t seed) {
    EXPECT_EQ(seed_everything(seed), seed);
    torch::Tensor weight = torch::empty({8, 4}, torch::TensorOptions().device(device));
    torch::nn::init::kaiming_uniform_(weight);
    return weight.to(torch::kCPU);
  };
  const torch::Tensor first = initialised(3);
  EXPECT_TRUE(torch::equal(initialised(3), first));
  EXPECT_FALSE(torch::equal(initialised(4), first));
}

TEST(XpuTrainer, SeedDecidesDropout) {
  if (const std::string why = xpu_cannot_train(); !why.empty()) GTEST_SKIP() << why;
  seed_decides_dropout_on("xpu", kXpu1);
}

TEST(XpuTrainer, SeedEverythingDecidesInitialisation) { seed_everything_decides_initialisation_on("xpu", kXpu1); }

// The emulated npu has a generator per device, which torch::manual_seed does
// not reach: only the accelerator's manual_seed does.
TEST(NpuTrainer, SeedDecidesDropout) {
  if (!detail::compat::kHasNamedPrivateUse1)
    GTEST_SKIP() << "the npu accelerator needs LibTorch >= 2.1, where PrivateUse1 can be named \"npu\"; this is "
                 << TORCH_VERSION;
  seed_decides_dropout_on("npu", kNpu1);
}

TEST(NpuTrainer, SeedEverythingDecidesInitialisation) {
  if (!detail::compat::kHasNamedPrivateUse1)
    GTEST_SKIP() << "the npu accelerator needs LibTorch >= 2.1, where PrivateUse1 can be named \"npu\"; this is "
                 << TORCH_VERSION;
  seed_everything_decides_initialisation_on("npu", kNpu1);
}

// The names DeviceStatsMonitor logged in a fit of two epochs on xpu:1.
std::set<std::string> device_stats_logged_on_xpu(std::optional<bool> cpu_stats) {
  TempDir dir;
  auto model = tiny_model();
  auto loader = regression_loader();
  auto logger = std::make_shared<testing::RecordingLogger>();
  TrainerOptions options = quiet("xpu", std::vector<int64_t>{1}, 2, dir);
  options.loggers = {logger};
  options.log_every_n_steps = 1;
  options.callbacks = {std::make_shared<DeviceStatsMonitor>(cpu_stats)};
  Trainer(options).fit(*model, loader);
  std::set<std::string> names;
  for (const auto& [step, metrics] : logger->calls)
    for (const auto& [name, value] : metrics)
      if (name.rfind("DeviceStatsMonitor.", 0) == 0) names.insert(name);
  return names;
}

// The xpu accelerator has no memory statistics to give: the monitor logs
// nothing of its own there, and the CPU's when asked to.
TEST(XpuTrainer, DeviceStatsMonitorLogsTheCpuStatsWhenAsked) {
  if (const std::string why = xpu_cannot_train(); !why.empty()) GTEST_SKIP() << why;
  load_runtime("xpu");
  EXPECT_TRUE(make_accelerator("xpu")->memory_stats(kXpu1).empty());
  EXPECT_EQ(device_stats_logged_on_xpu(std::nullopt), std::set<std::string>());
  const std::set<std::string> with_cpu = device_stats_logged_on_xpu(true);
  for (const char* hook : {"on_train_batch_start", "on_train_batch_end"})
    for (const char* stat : {"process_resident_bytes", "process_virtual_bytes"})
      EXPECT_EQ(with_cpu.count(fmt::format("DeviceStatsMonitor.{}/{}", hook, stat)), 1u) << hook << " " << stat;
  EXPECT_EQ(with_cpu.size(), 4u);
}

// A checkpoint saved on one accelerator and resumed on another, with the
// optimizer whose state has to move between them.
struct ResumeCase {
  std::string first, second;
  std::string optimizer;
};

std::string case_name(const ::testing::TestParamInfo<ResumeCase>& info) {
  return info.param.first + "_to_" + info.param.second + "_" + info.param.optimizer;
}

// For the test names ctest lists, instead of the bytes.
void PrintTo(const ResumeCase& c, std::ostream* out) { *out << c.first << " to " << c.second << ", " << c.optimizer; }

Devices devices_of(const std::string& accelerator) {
  return accelerator == "cpu"    ? Devices(1)
         : accelerator == "cuda" ? Devices(std::vector<int64_t>{0})
                                 : Devices(std::vector<int64_t>{1});
}

torch::Device device_of(const std::string& accelerator) {
  return accelerator == "xpu"    ? kXpu1
         : accelerator == "npu"  ? kNpu1
         : accelerator == "cuda" ? kCuda0
                                 : torch::Device(torch::kCPU);
}

class CheckpointAcrossAccelerators : public ::testing::TestWithParam<ResumeCase> {
 protected:
  void SetUp() override {
    const ResumeCase& c = GetParam();
    if (const std::string why = xpu_cannot_train(); (c.first == "xpu" || c.second == "xpu") && !why.empty())
      GTEST_SKIP() << why;
    if ((c.first == "cuda" || c.second == "cuda") && !torch::cuda::is_available())
      GTEST_SKIP() << "this machine has no CUDA device";
    if ((c.first == "npu" || c.second == "npu") && !detail::compat::kHasNamedPrivateUse1)
      GTEST_SKIP() << "the npu accelerator needs LibTorch >= 2.1, where PrivateUse1 can be named \"npu\"; this is "
                   << TORCH_VERSION;
  }
};

// One epoch on `first`, saved, and the second epoch resumed from that
// checkpoint on `second`, trains as two epochs on the CPU do.
TEST_P(CheckpointAcrossAccelerators, ResumesAsAnUninterruptedRunOnTheCpu) {
  const ResumeCase& c = GetParam();
  load_runtime(c.first);
  load_runtime(c.second);
  TempDir dir;
  auto straight = tiny_model(c.optimizer);
  auto straight_loader = regression_loader();
  Trainer uninterrupted(quiet("cpu", 1, 2, dir));
  uninterrupted.fit(*straight, straight_loader);

  auto before = tiny_model(c.optimizer);
  auto first_loader = regression_loader();
  Trainer one(quiet(c.first, devices_of(c.first), 1, dir));
  one.fit(*before, first_loader);
  const std::string path = (dir.path / "one_epoch.ckpt").string();
  one.save_checkpoint(path);

  auto after = tiny_model(c.optimizer);
  auto second_loader = regression_loader();
  Trainer two(quiet(c.second, devices_of(c.second), 2, dir));
  const FitResult result = two.fit(*after, second_loader, {path});
  EXPECT_EQ(result.global_step, 8);
  EXPECT_EQ(two.device(), device_of(c.second));
  for (const torch::Tensor& p : after->parameters()) EXPECT_EQ(p.device(), device_of(c.second));
  const bool cuda = c.first == "cuda" || c.second == "cuda";
  const double rtol = cuda ? kCudaRtol : kRtol, atol = cuda ? kCudaAtol : kAtol;
  expect_close(after->losses, std::vector<double>(straight->losses.begin() + 4, straight->losses.end()), rtol, atol);
  expect_close(*after, *straight, rtol, atol);
}

// Each optimizer keeps its state in its own type, which the Trainer moves onto
// the resuming device (HeavyBall: one the Trainer does not know).
INSTANTIATE_TEST_SUITE_P(Xpu, CheckpointAcrossAccelerators,
                         ::testing::Values(ResumeCase{"xpu", "cpu", "SGD"}, ResumeCase{"cpu", "xpu", "SGD"},
                                           ResumeCase{"cpu", "xpu", "Adam"}, ResumeCase{"cpu", "xpu", "AdamW"},
                                           ResumeCase{"cpu", "xpu", "RMSprop"}, ResumeCase{"cpu", "xpu", "Adagrad"},
                                           ResumeCase{"cpu", "xpu", "HeavyBall"}, ResumeCase{"xpu", "cpu", "HeavyBall"}),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Cuda, CheckpointAcrossAccelerators,
                         ::testing::Values(ResumeCase{"cuda", "cpu", "SGD"}, ResumeCase{"cpu", "cuda", "Adam"}),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Npu, CheckpointAcrossAccelerators,
                         ::testing::Values(ResumeCase{"npu", "cpu", "SGD"}, ResumeCase{"cpu", "npu", "SGD"},
                                           ResumeCase{"cpu", "npu", "Adam"}, ResumeCase{"cpu", "npu", "AdamW"},
                                           ResumeCase{"cpu", "npu", "RMSprop"}, ResumeCase{"cpu", "npu", "Adagrad"},
                                           ResumeCase{"cpu", "npu", "HeavyBall"}),
                         case_name);

}  // namespace
}  // namespace fulgor
