// The Trainer against a hand-written LibTorch loop: same model, data, seed,
// batch size and optimizer, run interleaved. The hand-written loop slices
// pre-built tensors; the Trainer reads the same tensors through TensorLoader.
// fulgor's own work per step is (fulgor - raw) / steps.

#include <torch/torch.h>

#include <filesystem>

#include "benchmarks.h"
#include "loops.h"
#include "models.h"

namespace fulgor::bench {

void overhead_benchmark(Report& report, const Settings& settings) {
  const int64_t samples = settings.quick ? 640 : 3200;
  const std::vector<Variant> variants = {{"barebones", false, 0, false},
                                         {"progress bar + log()", true, 1, false},
                                         {"two log() calls", false, 2, false},
                                         {"checkpoint each epoch", false, 0, true}};
  const auto root = (std::filesystem::temp_directory_path() / "fulgor-overhead-benchmark").string();

  for (const ModelSpec& spec : overhead_models()) {
    if (settings.quick && spec.name.rfind("cnn", 0) == 0) continue;
    const Workload work = spec.workload(samples, settings.quick ? 1 : 3);
    torch::manual_seed(1);
    const torch::nn::Sequential initial = spec.make();
    // The trained models' outputs on the last batch: both sides must agree.
    const auto probe = work.data.narrow(0, samples - kBatch, kBatch);
    torch::Tensor raw_output, fulgor_output;
    auto raw = [&] {
      auto net = raw_fit(initial, work);
      torch::NoGradGuard no_grad;
      raw_output = net->forward(probe);
    };
    for (const Variant& variant : variants) {
      if (settings.quick && variant.checkpoint) continue;
      auto through_fulgor = [&] {
        auto net = fulgor_fit(initial, work, variant, root);
        torch::NoGradGuard no_grad;
        fulgor_output = net->forward(probe);
      };
      // A short run (about 30 ms for the small models) is at the mercy of the
      // machine's hiccups: more of them make the median steady.
      const int repeats = spec.key == "cnn" ? settings.repeats : 4 * settings.repeats;
      auto medians = interleaved_medians({raw, through_fulgor}, repeats);
      const bool same = torch::allclose(raw_output, fulgor_output, 1e-5, 1e-6);
      const double ratio = medians[1] / medians[0];
      const double own_us = (medians[1] - medians[0]) / work.steps() * 1e6;
      report.row({"overhead", spec.name + ", " + variant.name,
                  fmt::format("{:.1f} us/step", medians[1] / work.steps() * 1e6),
                  fmt::format("{:.3f}x, {:+.1f} us/step{}", ratio, own_us, same ? "" : " (results differ!)")});
      if (variant.name == "barebones") {
        report.figures["overhead_ratio_" + spec.key] = ratio;
        if (spec.key == "linear") report.figures["overhead_us_tiny_barebones"] = own_us;
      }
      if (variant.name == "progress bar + log()") {
        report.figures["overhead_ratio_" + spec.key + "_logging"] = ratio;
        if (spec.key == "linear") report.figures["overhead_us_tiny"] = own_us;
      }
    }
  }
  std::filesystem::remove_all(root);
}

}  // namespace fulgor::bench
