#pragma once

// Antialiased bilinear resampling of a rectangle of an HWC uint8 image, as
// PyTorch's _upsample_bilinear2d_aa (torchvision's antialias=True) and PIL's
// BILINEAR: a triangle filter widened by the scale when shrinking.

#include <cstdint>
#include <vector>

namespace fulgor::detail {

// The taps of each output pixel along one axis.
struct AxisTaps {
  std::vector<int64_t> first;  // first input pixel
  std::vector<int64_t> count;  // 0: outside the input (a zero)
  std::vector<float> weights;  // `width` per output pixel, normalized
  int64_t width = 0;
};

// Output pixel i covers input [origin + i * extent / out, origin + (i + 1) * extent / out).
AxisTaps axis_taps(double origin, double extent, int64_t in_size, int64_t out_size);

// Resamples into `out`, CHW floats of out_h x out_w (x taps: `xs`, y taps:
// `ys`), mirrored left to right when `flip`.
void resample(const uint8_t* pixels, int64_t in_w, int64_t channels, const AxisTaps& xs, const AxisTaps& ys, bool flip,
              float* out);

}  // namespace fulgor::detail
