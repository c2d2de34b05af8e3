#include "data/resample.h"

#include <algorithm>
#include <cmath>

namespace fulgor::detail {

AxisTaps axis_taps(double origin, double extent, int64_t in_size, int64_t out_size) {
  const double scale = extent / static_cast<double>(out_size);
  const double support = scale >= 1.0 ? scale : 1.0;
  const double inv = scale >= 1.0 ? 1.0 / scale : 1.0;
  AxisTaps taps;
  taps.width = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.assign(static_cast<size_t>(out_size), 0);
  taps.count.assign(static_cast<size_t>(out_size), 0);
  taps.weights.assign(static_cast<size_t>(out_size * taps.width), 0.0f);
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = origin + scale * (static_cast<double>(i) + 0.5);
    // Where a CenterCrop pads, the pixel is a zero.
    if (center < 0.0 || center >= static_cast<double>(in_size)) continue;
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size);
    const int64_t n = std::min(hi - lo, taps.width);
    float* w = &taps.weights[static_cast<size_t>(i * taps.width)];
    double total = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const double d = std::abs((static_cast<double>(j + lo) - center + 0.5) * inv);
      w[j] = static_cast<float>(d < 1.0 ? 1.0 - d : 0.0);
      total += w[j];
    }
    if (total <= 0.0) continue;
    for (int64_t j = 0; j < n; ++j) w[j] = static_cast<float>(w[j] / total);
    taps.first[static_cast<size_t>(i)] = lo;
    taps.count[static_cast<size_t>(i)] = n;
  }
  return taps;
}

namespace {

// Note [Resampling in two contiguous passes]
// Both passes run along memory: the horizontal one over each source row the
// output reads, with the channel count a constant (1 or 3) so that the
// compiler unrolls it; the vertical one as a sum of whole filtered rows
// (contiguous, vectorised), scattered into the CHW output at the end of each
// row. The sums are the same products in the same order as a per-pixel
// loop, so the output does not change with this arrangement.
template <int64_t C>
void filter_rows(const uint8_t* pixels, int64_t in_w, const AxisTaps& xs, int64_t row0, int64_t row1, float* rows) {
  const auto out_w = static_cast<int64_t>(xs.first.size());
  for (int64_t r = row0; r < row1; ++r) {
    const uint8_t* src = pixels + r * in_w * C;
    float* dst = rows + (r - row0) * out_w * C;
    for (int64_t x = 0; x < out_w; ++x) {
      const float* w = &xs.weights[static_cast<size_t>(x * xs.width)];
      const uint8_t* p = src + xs.first[static_cast<size_t>(x)] * C;
      float sum[C] = {};
      for (int64_t k = 0; k < xs.count[static_cast<size_t>(x)]; ++k)
        for (int64_t c = 0; c < C; ++c) sum[c] += w[k] * static_cast<float>(p[k * C + c]);
      for (int64_t c = 0; c < C; ++c) dst[x * C + c] = sum[c];
    }
  }
}

}  // namespace

void resample(const uint8_t* pixels, int64_t in_w, int64_t channels, const AxisTaps& xs, const AxisTaps& ys, bool flip,
              float* out) {
  const auto out_w = static_cast<int64_t>(xs.first.size());
  const auto out_h = static_cast<int64_t>(ys.first.size());
  // The rows any output row reads, filtered horizontally once each.
  int64_t row0 = -1, row1 = -1;
  for (int64_t y = 0; y < out_h; ++y) {
    if (ys.count[static_cast<size_t>(y)] == 0) continue;
    const int64_t first = ys.first[static_cast<size_t>(y)];
    if (row0 < 0 || first < row0) row0 = first;
    row1 = std::max(row1, first + ys.count[static_cast<size_t>(y)]);
  }
  std::fill(out, out + channels * out_h * out_w, 0.0f);
  if (row0 < 0) return;
  const int64_t stride = out_w * channels;
  std::vector<float> rows(static_cast<size_t>((row1 - row0) * stride), 0.0f);
  if (channels == 3)
    filter_rows<3>(pixels, in_w, xs, row0, row1, rows.data());
  else
    filter_rows<1>(pixels, in_w, xs, row0, row1, rows.data());
  std::vector<float> line(static_cast<size_t>(stride));
  for (int64_t y = 0; y < out_h; ++y) {
    if (ys.count[static_cast<size_t>(y)] == 0) continue;  // a padded row: zeros
    const float* w = &ys.weights[static_cast<size_t>(y * ys.width)];
    const float* first = rows.data() + (ys.first[static_cast<size_t>(y)] - row0) * stride;
    std::fill(line.begin(), line.end(), 0.0f);
    for (int64_t k = 0; k < ys.count[static_cast<size_t>(y)]; ++k) {
      const float wk = w[k];
      const float* row = first + k * stride;
      for (int64_t i = 0; i < stride; ++i) line[static_cast<size_t>(i)] += wk * row[i];
    }
    for (int64_t x = 0; x < out_w; ++x) {
      if (xs.count[static_cast<size_t>(x)] == 0) continue;
      const int64_t ox = flip ? out_w - 1 - x : x;
      for (int64_t c = 0; c < channels; ++c)
        out[(c * out_h + y) * out_w + ox] = line[static_cast<size_t>(x * channels + c)];
    }
  }
}

}  // namespace fulgor::detail
