// bf16-mixed against fp32 on the CPU: the same Trainer run at precision "32"
// and "bf16-mixed", interleaved. Whether bf16 is faster depends on the CPU:
// without bf16 matrix instructions (AVX512-BF16, AMX) LibTorch converts to and
// from bf16 around fp32 arithmetic, and mixed precision costs time instead of
// saving it. The final losses show what the reduced precision changes.

#include <torch/torch.h>

#include <filesystem>

#include "benchmarks.h"
#include "loops.h"
#include "models.h"

namespace fulgor::bench {

void precision_benchmark(Report& report, const Settings& settings) {
  const auto root = (std::filesystem::temp_directory_path() / "fulgor-precision-benchmark").string();
  for (const ModelSpec& spec : overhead_models()) {
    if (spec.key == "linear") continue;
    const bool cnn = spec.key == "cnn";
    const Workload work = spec.workload(cnn ? 640 : 3200, 1);
    torch::manual_seed(1);
    const torch::nn::Sequential initial = spec.make();
    Variant fp32{"32", false, 0, false}, bf16{"bf16-mixed", false, 0, false};
    fp32.precision = "32";
    bf16.precision = "bf16-mixed";
    double loss32 = 0, loss16 = 0;
    auto medians = interleaved_medians({[&] { loss32 = final_loss(fulgor_fit(initial, work, fp32, root), work); },
                                        [&] { loss16 = final_loss(fulgor_fit(initial, work, bf16, root), work); }},
                                       settings.quick ? 1 : settings.repeats);
    report.row({"precision", spec.name + ", 32", fmt::format("{:.1f} us/step", medians[0] / work.steps() * 1e6),
                fmt::format("final loss {:.4f}", loss32)});
    report.row({"precision", spec.name + ", bf16-mixed", fmt::format("{:.1f} us/step", medians[1] / work.steps() * 1e6),
                fmt::format("{:.2f}x time, final loss {:.4f}", medians[1] / medians[0], loss16)});
    report.figures["bf16_mixed_time_ratio_" + spec.key] = medians[1] / medians[0];
  }
  std::filesystem::remove_all(root);
}

}  // namespace fulgor::bench
