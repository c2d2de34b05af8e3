#pragma once

// Pinned batches need a LibTorch that can pin host memory (one built with
// CUDA); a loader asked for them checks once, where pin_memory is set,
// rather than failing at its first batch.

#include <fmt/format.h>
#include <torch/torch.h>

#include "fulgor/core/error.h"

namespace fulgor::detail {

/// Throws a ConfigError naming `loader` ("TensorLoader") where this LibTorch
/// cannot pin host memory.
inline void require_pinning(const char* loader) {
  try {
    torch::empty({1}, torch::TensorOptions().pinned_memory(true));
  } catch (const c10::Error& e) {
    throw ConfigError(
        fmt::format("{} pin_memory: this LibTorch cannot pin host memory ({}); pinned batches need a "
                    "LibTorch with CUDA",
                    loader, e.what_without_backtrace()));
  }
}

}  // namespace fulgor::detail
