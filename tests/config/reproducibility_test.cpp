// The options for reproducible and debuggable runs: deterministic, seed and
// detect_anomaly.

#include <ATen/Context.h>
#include <torch/csrc/autograd/anomaly_mode.h>

#include <optional>
#include <utility>
#include <vector>

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

// LibTorch's deterministic setting is global: each test puts the default back.
struct RestoreDeterminism {
  ~RestoreDeterminism() { at::globalContext().setDeterministicAlgorithms(false, /*warn_only=*/false); }
};

// LibTorch's deterministic setting (and its warn_only) while each training and
// test batch ran.
struct DeterminismProbe : Callback {
  std::vector<std::pair<bool, bool>> seen;
  void record() {
    seen.emplace_back(at::globalContext().deterministicAlgorithms(),
                      at::globalContext().deterministicAlgorithmsWarnOnly());
  }
  void on_train_batch_start(Trainer&, ModuleBase&, int64_t) override { record(); }
  void on_test_batch_end(Trainer&, ModuleBase&, int64_t) override { record(); }
};

TEST(Reproducibility, DeterministicHoldsWhileLoopsRunAndThePreviousSettingReturns) {
  RestoreDeterminism restore;
  auto& context = at::globalContext();
  // A setting of the caller's own, which must come back after each loop.
  context.setDeterministicAlgorithms(false, /*warn_only=*/true);
  TempDir dir;
  TinyNet model;
  auto loader = sequential_loader(8, 4);
  auto probe = std::make_shared<DeterminismProbe>();
  auto options = quiet(dir, 1, {probe});
  options.deterministic = true;
  Trainer trainer(options);
  trainer.fit(model, loader);
  EXPECT_FALSE(context.deterministicAlgorithms());
  EXPECT_TRUE(context.deterministicAlgorithmsWarnOnly());
  trainer.test(model, loader);
  ASSERT_EQ(probe->seen.size(), 4u);  // 2 training and 2 test batches
  for (const auto& [deterministic, warn_only] : probe->seen) {
    EXPECT_TRUE(deterministic);
    EXPECT_FALSE(warn_only);  // an error, not a warning
  }
  EXPECT_FALSE(context.deterministicAlgorithms());
  EXPECT_TRUE(context.deterministicAlgorithmsWarnOnly());

  // Without the option the loops leave the setting alone.
  context.setDeterministicAlgorithms(false, /*warn_only=*/false);
  probe->seen.clear();
  Trainer plain(quiet(dir, 1, {probe}));
  plain.fit(model, loader);
  ASSERT_EQ(probe->seen.size(), 2u);
  for (const auto& seen : probe->seen) EXPECT_FALSE(seen.first);
}

// A training step with an operation LibTorch reports as nondeterministic,
// as its CUDA index_add and scatter_add kernels do.
struct NondeterministicStep : TinyNet {
  torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override {
    at::globalContext().alertNotDeterministic("NondeterministicStep::training_step");
    return TinyNet::training_step(std::move(batch), batch_idx);
  }
};

TEST(Reproducibility, DeterministicMakesANondeterministicOperationFailTheFit) {
  RestoreDeterminism restore;
  TempDir dir;
  auto train = sequential_loader(8, 4);
  NondeterministicStep refused;
  auto options = quiet(dir, 1);
  options.deterministic = true;
  Trainer strict(options);
  try {
    strict.fit(refused, train);
    ADD_FAILURE() << "fit ran a nondeterministic operation with deterministic=true";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("NondeterministicStep::training_step"), std::string::npos) << e.what();
  }
  EXPECT_EQ(refused.training_steps, 0);
  // Put back on the way out of the failed fit too.
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());

  NondeterministicStep allowed;
  Trainer lenient(quiet(dir, 1));
  EXPECT_NO_THROW(lenient.fit(allowed, train));
  EXPECT_EQ(allowed.training_steps, 2);
}

// Fits a copy of `start` for two epochs, with the CPU generator left at
// `generator_seed` by whatever ran before.
std::unique_ptr<TinyNet> fit_copy(const TempDir& dir, TinyNet& start, double dropout, bool shuffle,
                                  std::optional<uint64_t> seed, uint64_t generator_seed) {
  auto model = std::make_unique<TinyNet>(dropout);
  copy_parameters(start, *model);
  auto options = quiet(dir, 2);
  options.seed = seed;
  Trainer trainer(options);
  torch::manual_seed(generator_seed);
  if (shuffle) {
    auto train = shuffled_loader(24, 4);
    trainer.fit(*model, train);
  } else {
    auto train = sequential_loader(24, 4);
    trainer.fit(*model, train);
  }
  return model;
}

// The seed decides each random draw in fit: the shuffling of the batches and
// dropout, each checked alone. Without a seed the same fits differ, which shows
// that the draws happen and that it is the seed that makes them repeat.
TEST(Reproducibility, SeedDecidesShufflingAndDropout) {
  TempDir dir;
  struct Case {
    const char* what;
    double dropout;
    bool shuffle;
  };
  for (const Case& c : {Case{"shuffling", 0.0, true}, Case{"dropout", 0.5, false}}) {
    SCOPED_TRACE(c.what);
    torch::manual_seed(1);
    TinyNet start(c.dropout);
    auto a = fit_copy(dir, start, c.dropout, c.shuffle, 5, 100);
    auto b = fit_copy(dir, start, c.dropout, c.shuffle, 5, 200);
    auto other_seed = fit_copy(dir, start, c.dropout, c.shuffle, 6, 100);
    auto unseeded_a = fit_copy(dir, start, c.dropout, c.shuffle, std::nullopt, 100);
    auto unseeded_b = fit_copy(dir, start, c.dropout, c.shuffle, std::nullopt, 200);
    EXPECT_TRUE(same_parameters(*a, *b));
    EXPECT_FALSE(same_parameters(*a, *other_seed));
    EXPECT_FALSE(same_parameters(*unseeded_a, *unseeded_b));
    EXPECT_FALSE(same_parameters(*a, start));  // it trained
  }
}

// The CPU, recording the seeds the Trainer gives its manual_seed.
class SeedRecordingCpu final : public Accelerator {
 public:
  torch::DeviceType device_type() const override { return torch::kCPU; }
  std::string description() const override { return "the CPU, recording manual_seed"; }
  int priority() const override { return -100; }
  Availability availability() const override { return {true, {}}; }
  int64_t device_count() const override { return 1; }
  std::string distributed_backend() const override { return "gloo"; }
  void manual_seed(uint64_t seed) const override {
    seeds().push_back(seed);
    Accelerator::manual_seed(seed);
  }
  static std::vector<uint64_t>& seeds() {
    static std::vector<uint64_t> all;
    return all;
  }
};

// The seed reaches the devices through the accelerator, once per loop, and
// only when set.
TEST(Reproducibility, SeedGoesThroughTheAccelerator) {
  AcceleratorRegistry::instance().add("seed_recording_cpu", [] { return std::make_unique<SeedRecordingCpu>(); });
  SeedRecordingCpu::seeds().clear();
  TempDir dir;
  TinyNet model;
  auto train = sequential_loader(8, 4);
  auto options = quiet(dir, 1);
  options.accelerator = "seed_recording_cpu";
  options.seed = 9;
  Trainer(options).fit(model, train);
  Trainer(options).test(model, train);
  options.seed.reset();
  Trainer(options).fit(model, train);
  AcceleratorRegistry::instance().remove("seed_recording_cpu");
  EXPECT_EQ(SeedRecordingCpu::seeds(), (std::vector<uint64_t>{9, 9}));
}

// A training step whose backward produces NaN: sqrt's derivative at x < 0.
struct NanBackward : TinyNet {
  std::vector<bool> anomaly_mode;  // whether anomaly detection was on, per step
  torch::Tensor training_step(torch::data::Example<> batch, int64_t) override {
    ++training_steps;
    anomaly_mode.push_back(torch::autograd::AnomalyMode::is_enabled());
    return torch::sqrt(-forward(batch.data).pow(2) - 1).mean();
  }
};

TEST(Reproducibility, DetectAnomalyFailsTheFitNamingTheOperationThatMadeNaN) {
  TempDir dir;
  auto train = sequential_loader(8, 4);
  NanBackward detected;
  auto options = quiet(dir, 1);
  options.detect_anomaly = true;
  Trainer checking(options);
  try {
    checking.fit(detected, train);
    ADD_FAILURE() << "a backward producing NaN passed with detect_anomaly=true";
  } catch (const std::exception& e) {  // autograd throws a std::runtime_error here, not a c10::Error
    const std::string message = e.what();
    EXPECT_NE(message.find("SqrtBackward"), std::string::npos) << message;
    EXPECT_NE(message.find("nan"), std::string::npos) << message;
  }
  EXPECT_EQ(detected.anomaly_mode, std::vector<bool>{true});
  EXPECT_FALSE(torch::autograd::AnomalyMode::is_enabled());

  // Without it the same NaN goes unnoticed into the weights.
  NanBackward unchecked;
  Trainer trusting(quiet(dir, 1));
  EXPECT_NO_THROW(trusting.fit(unchecked, train));
  EXPECT_EQ(unchecked.anomaly_mode, (std::vector<bool>{false, false}));
  EXPECT_TRUE(torch::isnan(unchecked.l1->weight).any().item<bool>());
}

}  // namespace
}  // namespace fulgor::testing
