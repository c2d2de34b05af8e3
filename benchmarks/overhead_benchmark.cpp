// The Trainer against a hand-written LibTorch loop: same model, data, seed,
// batch size and optimizer, run interleaved. The hand-written loop slices
// pre-built tensors; the Trainer reads the same tensors through TensorLoader.
// fulgor's own work per step is (fulgor - raw) / steps.
//
// Note [Paired runs]
// On a shared machine one run's time differs from the next one's by several
// percent either way, and by about as much for a run of 10 steps as for one of
// 300: the noise comes with the run and does not average out over its steps.
// Each hand-written run and the Trainer run next to it form a pair (the
// Trainer's run second in one pair, first in the next), and the figures are
// medians of the pairs' ratios and differences (Note [Several processes]).
// Runs are kept short so that many pairs fit in a few minutes: 300 steps for
// the small models (long enough that the Trainer's set-up and teardown, some
// 50 to 90 us per fit, add 0.2 to 0.3 us per step), 10 for the CNN.
//
// Note [Page faults]
// glibc gives freed memory back to the kernel and faults it in again at a
// cadence that depends on the heap's history: in one process the hand-written
// CNN loop took about 1,000 page faults per step (a third of its time in the
// kernel) in its first measured run and about 10 in the next. Each measuring
// process fixes malloc's mmap and trim thresholds, as is common advice for
// LibTorch on the CPU, so that neither side pays for the other's history.
//
// Note [Several processes]
// Where code and heap blocks happen to lie in one process shifts both sides'
// times by several percent for the whole life of that process (two copies of
// the same hand-written loop differ that much in one process and not in
// another; the CNN's hand-written loop came out 6% slower than the Trainer in
// one process, three runs out of three), which no number of repeats inside it
// removes. So every model is measured in several fresh processes (new
// address-space layout, new heap). The pairs of one process share its layout
// and are no independent draws: each figure is the median of the processes'
// own medians, with its interval from those (with 7 processes, their range).

#include <malloc.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "benchmarks.h"
#include "fulgor/detail/compat.h"
#include "loops.h"
#include "models.h"

namespace fulgor::bench {
namespace {

const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = [] {
    std::vector<Variant> out{{"barebones", false, 0, false},
                             // Before gradients were set to none (LibTorch 1.13's zero_grad()).
                             {"barebones, zeroed in place", false, 0, false, "32", "", "sgd", {}, false, true},
                             {"progress bar + log()", true, 1, false},
                             {"two log() calls", false, 2, false},
                             {"checkpoint each epoch", false, 0, true},
                             // Its report is printed (to the quieted stdout) after each fit.
                             {"profiler \"simple\"", false, 0, false, "32", "simple"},
                             // Against the hand-written loop's torch::optim::Adam.
                             {"foreach Adam", false, 0, false, "32", "", "adam", fused_or_foreach(false)},
                             // The hand-written loop converted to Fabric, against itself.
                             {"Fabric loop", false, 0, false, "32", "", "sgd", {}, true}};
    // LibTorch's CPU fused kernels came with 2.4.
    if (FULGOR_TORCH_AT_LEAST(2, 4))
      out.push_back({"fused Adam", false, 0, false, "32", "", "adam", fused_or_foreach(true)});
    return out;
  }();
  return all;
}

const ModelSpec& model_named(const std::string& key) {
  static const std::vector<ModelSpec> models = overhead_models();
  for (const auto& spec : models)
    if (spec.key == key) return spec;
  throw std::invalid_argument("no overhead model '" + key + "'");
}

struct Measured {
  std::vector<double> raw, fulgor;  // seconds per run, pair by pair
  bool same = true;                 // both sides ended with the same model
};

// Note [Paired runs]: 300 steps per run for the small models (3 epochs), 10
// for the CNN (one epoch, a tenth of a second).
int64_t samples_for(const ModelSpec& spec, bool quick) { return quick ? 640 : spec.key == "cnn" ? 320 : 3200; }
int64_t epochs_for(const ModelSpec& spec, bool quick) { return quick ? 1 : spec.key == "cnn" ? 1 : 3; }
// Pairs per process: about 200 in all for the CNN, 280 for the others.
int pairs_for(const ModelSpec& spec, const Settings& settings) {
  return settings.quick ? settings.repeats : spec.key == "cnn" ? 6 * settings.repeats : 8 * settings.repeats;
}

// `repeats` pairs of runs, in this process.
Measured measure(const ModelSpec& spec, const Variant& variant, int repeats, bool quick) {
  const int64_t samples = samples_for(spec, quick);
  const Workload work = spec.workload(samples, epochs_for(spec, quick));
  torch::manual_seed(1);
  const torch::nn::Sequential initial = spec.make();
  const auto root =
      (std::filesystem::temp_directory_path() / ("fulgor-overhead-benchmark-" + std::to_string(::getpid()))).string();
  // The trained models' outputs on the last batch: both sides must agree.
  const auto probe = work.data.narrow(0, samples - kBatch, kBatch);
  torch::Tensor raw_output, fulgor_output;
  auto raw = [&] {
    auto net = raw_fit(initial, work, variant.optimizer);
    torch::NoGradGuard no_grad;
    raw_output = net->forward(probe);
  };
  auto through_fulgor = [&] {
    auto net = variant.fabric ? fabric_fit(initial, work) : fulgor_fit(initial, work, variant, root);
    torch::NoGradGuard no_grad;
    fulgor_output = net->forward(probe);
  };
  auto times = interleaved_times({raw, through_fulgor}, repeats);
  std::filesystem::remove_all(root);
  return {times[0], times[1], torch::allclose(raw_output, fulgor_output, 1e-5, 1e-6)};
}

// Runs measure() in a fresh copy of this program (see overhead_child).
Measured measure_in_child(const ModelSpec& spec, size_t variant, int repeats, bool quick) {
  const std::string command =
      fmt::format("/proc/{}/exe --overhead-child {} {} {} {}", ::getpid(), spec.key, variant, repeats, quick ? 1 : 0);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  Measured m;
  int same = 0, pairs = 0;
  bool read = pipe && std::fscanf(pipe.get(), "%d %d", &same, &pairs) == 2;
  for (int i = 0; read && i < pairs; ++i) {
    double raw = 0, fulgor = 0;
    read = std::fscanf(pipe.get(), "%lf %lf", &raw, &fulgor) == 2;
    m.raw.push_back(raw);
    m.fulgor.push_back(fulgor);
  }
  if (!read || pairs == 0) throw std::runtime_error("the overhead benchmark's child process failed: " + command);
  m.same = same != 0;
  return m;
}

}  // namespace

int overhead_child(const std::string& model, size_t variant, int repeats, bool quick) {
  // Note [Page faults]
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 256 << 20);
  const Measured m = measure(model_named(model), variants().at(variant), repeats, quick);
  std::printf("%d %zu\n", m.same ? 1 : 0, m.raw.size());
  for (size_t i = 0; i < m.raw.size(); ++i) std::printf("%.9f %.9f\n", m.raw[i], m.fulgor[i]);
  return 0;
}

void overhead_benchmark(Report& report, const Settings& settings) {
  const bool quick = settings.quick;
  auto chosen = [](const std::vector<std::string>& names, const std::string& name) {
    return names.empty() || std::find(names.begin(), names.end(), name) != names.end();
  };
  for (const ModelSpec& spec : overhead_models()) {
    const bool cnn = spec.key == "cnn";
    if ((quick && cnn) || !chosen(settings.overhead_models, spec.key)) continue;
    const int64_t steps = epochs_for(spec, quick) * (samples_for(spec, quick) / kBatch);
    const int processes = quick ? 1 : settings.processes;
    const int repeats = pairs_for(spec, settings);
    for (size_t v = 0; v < variants().size(); ++v) {
      const Variant& variant = variants()[v];
      if ((quick && variant.checkpoint) || !chosen(settings.overhead_variants, variant.name)) continue;
      // Note [Several processes]: one process's pairs are one draw, unless
      // there is a single process.
      std::vector<double> ratios, own_us, fulgor_us;
      bool same = true;
      for (int p = 0; p < processes; ++p) {
        const Measured m =
            processes == 1 ? measure(spec, variant, repeats, quick) : measure_in_child(spec, v, repeats, quick);
        std::vector<double> pair_ratios, pair_own_us;
        for (size_t i = 0; i < m.raw.size(); ++i) {
          pair_ratios.push_back(m.fulgor[i] / m.raw[i]);
          pair_own_us.push_back((m.fulgor[i] - m.raw[i]) / steps * 1e6);
          fulgor_us.push_back(m.fulgor[i] / steps * 1e6);
        }
        if (processes == 1) {
          ratios = pair_ratios;
          own_us = pair_own_us;
        } else {
          ratios.push_back(median(pair_ratios));
          own_us.push_back(median(pair_own_us));
        }
        same = same && m.same;
      }
      const double ratio = median(ratios), own = median(own_us);
      const auto [ratio_low, ratio_high] = median_interval(ratios);
      const auto [own_low, own_high] = median_interval(own_us);
      report.row({"overhead", spec.name + ", " + variant.name, fmt::format("{:.1f} us/step", median(fulgor_us)),
                  fmt::format("{:.3f}x [{:.3f}, {:.3f}], {:+.1f} us/step [{:+.1f}, {:+.1f}]{}", ratio, ratio_low,
                              ratio_high, own, own_low, own_high, same ? "" : " (results differ!)")});
      if (variant.name == "barebones") {
        report.figures["overhead_ratio_" + spec.key] = ratio;
        if (spec.key == "linear") report.figures["overhead_us_tiny_barebones"] = own;
      }
      if (variant.fabric) report.figures["overhead_ratio_" + spec.key + "_fabric"] = ratio;
      if (!variant.profiler.empty() && spec.key == "linear") report.figures["overhead_us_tiny_profiler"] = own;
      if (variant.name == "progress bar + log()") {
        report.figures["overhead_ratio_" + spec.key + "_logging"] = ratio;
        if (spec.key == "linear") report.figures["overhead_us_tiny"] = own;
      }
    }
  }
}

}  // namespace fulgor::bench
