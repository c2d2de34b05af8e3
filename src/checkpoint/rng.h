#pragma once

// The generator states a checkpoint keeps: "rng_cpu" and "rng_epoch_start"
// (LibTorch's CPU generator now, and when the epoch began) and "rng_device"
// (the accelerator's).

#include <torch/types.h>

namespace fulgor {
class Accelerator;
}

namespace fulgor::detail {

struct LoadedCheckpoint;

torch::Tensor cpu_rng_state();
void set_cpu_rng_state(const torch::Tensor& state);

// Sets the CPU generator from the entry `cpu_key` of `ckpt`, and with
// "rng_cpu" the device's from "rng_device" when `accelerator` is the one that
// saved it.
void restore_rng(LoadedCheckpoint& ckpt, const char* cpu_key, Accelerator& accelerator, const c10::Device& device);

}  // namespace fulgor::detail
