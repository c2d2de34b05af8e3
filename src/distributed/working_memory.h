#pragma once

// Memory that a collective's steps reuse from call to call.

#include <torch/types.h>

namespace fulgor::detail {

/// Bytes kept between calls and grown to the largest asked for: the buckets
/// of every training step would otherwise allocate the same sizes afresh,
/// and the system fault in their pages each time.
class WorkingMemory {
 public:
  /// `numel` elements of `options`' dtype on its device, valid until the
  /// next call.
  torch::Tensor get(int64_t numel, const torch::TensorOptions& options) {
    const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(options.dtype().toScalarType()));
    if (!bytes_.defined() || bytes_.numel() < bytes || bytes_.device() != options.device())
      bytes_ = torch::empty({bytes}, options.dtype(torch::kUInt8));
    return bytes_.narrow(0, 0, bytes).view(options.dtype().toScalarType());
  }

 private:
  torch::Tensor bytes_;
};

}  // namespace fulgor::detail
