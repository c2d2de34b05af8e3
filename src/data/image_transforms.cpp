#include "fulgor/data/image_transforms.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "data/resample.h"
#include "data/sample_random.h"

namespace fulgor {
namespace {

// torchvision's size: {s} or {h, w}, positive.
void check_size(const std::vector<int64_t>& size, const char* transform) {
  if ((size.size() != 1 && size.size() != 2) || std::any_of(size.begin(), size.end(), [](int64_t s) { return s < 1; }))
    throw ConfigError(fmt::format("{} size=[{}] is not valid: give {{s}} or {{height, width}}, each >= 1", transform,
                                  fmt::join(size, ", ")));
}

// Python's round(): halves to even, as std::nearbyint in the default mode.
int64_t py_round(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

// The geometric state while planning: the current image (its size, how its
// pixels map to the source's rectangle, whether it is mirrored).
struct Plane {
  ImageCrop crop;
  int64_t width, height;
  // Cuts [left, left + w) x [top, top + h) of the current image.
  void cut(double left, double top, int64_t w, int64_t h) {
    const double sx = crop.width / static_cast<double>(width), sy = crop.height / static_cast<double>(height);
    // A mirrored image's left is the source's right.
    const double from_left = crop.flip ? static_cast<double>(width) - left - static_cast<double>(w) : left;
    crop.x += from_left * sx;
    crop.y += top * sy;
    crop.width = static_cast<double>(w) * sx;
    crop.height = static_cast<double>(h) * sy;
    width = w;
    height = h;
  }
};

// torchvision's Resize size: {s} resizes the smaller edge.
std::pair<int64_t, int64_t> resized(const std::vector<int64_t>& size, int64_t w, int64_t h) {
  if (size.size() == 2) return {size[1], size[0]};
  const int64_t short_edge = std::min(w, h), long_edge = std::max(w, h);
  const auto new_long = static_cast<int64_t>(static_cast<double>(size[0]) * static_cast<double>(long_edge) /
                                             static_cast<double>(short_edge));
  return w <= h ? std::pair{size[0], new_long} : std::pair{new_long, size[0]};
}

void center_crop(Plane& p, const std::vector<int64_t>& size) {
  const int64_t h = size[0], w = size.size() == 2 ? size[1] : size[0];
  // torchvision pads by (crop - image) // 2 on the left/top first.
  const double left = w > p.width ? -static_cast<double>((w - p.width) / 2)
                                  : static_cast<double>(py_round(static_cast<double>(p.width - w) / 2.0));
  const double top = h > p.height ? -static_cast<double>((h - p.height) / 2)
                                  : static_cast<double>(py_round(static_cast<double>(p.height - h) / 2.0));
  p.cut(left, top, w, h);
}

// torchvision's RandomResizedCrop.get_params.
void random_resized_crop(Plane& p, const RandomResizedCrop& t, detail::SampleRandom& random) {
  const double area = static_cast<double>(p.width * p.height);
  const double log_lo = std::log(t.ratio[0]), log_hi = std::log(t.ratio[1]);
  const int64_t out_h = t.size[0], out_w = t.size.size() == 2 ? t.size[1] : t.size[0];
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * random.uniform(t.scale[0], t.scale[1]);
    const double aspect = std::exp(random.uniform(log_lo, log_hi));
    const int64_t w = py_round(std::sqrt(target * aspect)), h = py_round(std::sqrt(target / aspect));
    if (0 < w && w <= p.width && 0 < h && h <= p.height) {
      const int64_t top = random.below(p.height - h + 1), left = random.below(p.width - w + 1);
      p.cut(static_cast<double>(left), static_cast<double>(top), w, h);
      p.width = out_w;
      p.height = out_h;
      return;
    }
  }
  const double in_ratio = static_cast<double>(p.width) / static_cast<double>(p.height);
  const double lo = std::min(t.ratio[0], t.ratio[1]), hi = std::max(t.ratio[0], t.ratio[1]);
  int64_t w = p.width, h = p.height;
  if (in_ratio < lo) {
    h = py_round(static_cast<double>(w) / lo);
  } else if (in_ratio > hi) {
    w = py_round(static_cast<double>(h) * hi);
  }
  p.cut(static_cast<double>((p.width - w) / 2), static_cast<double>((p.height - h) / 2), w, h);
  p.width = out_w;
  p.height = out_h;
}

}  // namespace

ImageTransforms::ImageTransforms(std::vector<ImageTransform> steps, ImageOutput output)
    : steps_(std::move(steps)), output_(output) {
  if (output_.channels != 1 && output_.channels != 3)
    throw ConfigError(fmt::format("ImageOutput channels={} is not valid: 1 (gray) or 3 (RGB)", output_.channels));
  if (output_.dtype != torch::kFloat && output_.dtype != torch::kByte)
    throw ConfigError(
        fmt::format("ImageOutput dtype={} is not valid: torch::kFloat or torch::kByte", c10::toString(output_.dtype)));
  bool fixed = false, normalized = false;
  for (const auto& step : steps_) {
    if (normalized && !std::holds_alternative<Normalize>(step))
      throw ConfigError("ImageTransforms: Normalize must come after the geometric transforms");
    if (const auto* t = std::get_if<Resize>(&step)) {
      check_size(t->size, "Resize");
      fixed = t->size.size() == 2;
    } else if (const auto* c = std::get_if<CenterCrop>(&step)) {
      check_size(c->size, "CenterCrop");
      fixed = true;
    } else if (const auto* r = std::get_if<RandomResizedCrop>(&step)) {
      check_size(r->size, "RandomResizedCrop");
      if (!(r->scale[0] > 0 && r->scale[0] <= r->scale[1] && r->ratio[0] > 0 && r->ratio[0] <= r->ratio[1]))
        throw ConfigError(
            fmt::format("RandomResizedCrop scale=({}, {}) ratio=({}, {}) is not valid: each a range "
                        "(low <= high) of positive numbers",
                        r->scale[0], r->scale[1], r->ratio[0], r->ratio[1]));
      fixed = true;
    } else if (const auto* f = std::get_if<RandomHorizontalFlip>(&step)) {
      if (!(f->p >= 0.0 && f->p <= 1.0))
        throw ConfigError(fmt::format("RandomHorizontalFlip p={} is not valid: a probability in [0, 1]", f->p));
    } else if (const auto* n = std::get_if<Normalize>(&step)) {
      if (output_.dtype != torch::kFloat)
        throw ConfigError("ImageTransforms: Normalize needs float output (ImageOutput dtype torch::kFloat)");
      const auto c = static_cast<size_t>(output_.channels);
      if ((n->mean.size() != 1 && n->mean.size() != c) || (n->std.size() != 1 && n->std.size() != c) ||
          std::any_of(n->std.begin(), n->std.end(), [](double s) { return s == 0.0; }))
        throw ConfigError(fmt::format(
            "Normalize mean=[{}] std=[{}] is not valid for {} channels: one value or one per channel, std non-zero",
            fmt::join(n->mean, ", "), fmt::join(n->std, ", "), c));
      if (normalized) throw ConfigError("ImageTransforms: Normalize is given twice");
      normalized = true;
      for (size_t i = 0; i < c; ++i) {
        mean_.push_back(static_cast<float>(n->mean[n->mean.size() == 1 ? 0 : i]));
        inv_std_.push_back(static_cast<float>(1.0 / n->std[n->std.size() == 1 ? 0 : i]));
      }
    }
  }
  if (!fixed)
    throw ConfigError(
        "ImageTransforms: a batch needs one image size: end the geometric transforms with a CenterCrop, a "
        "RandomResizedCrop or a Resize to {height, width}");
  const ImageCrop probe = plan(1000, 1000, 0, 0, 0);
  width_ = probe.out_width;
  height_ = probe.out_height;
}

// Note [One resampling]
// torchvision resizes, then crops the resized image. The plan instead maps
// every crop back to a rectangle of the source, and resamples that rectangle
// once to the output size: the same pixels up to the filter's reach at the
// rectangle's edges, and no intermediate image. It is what lets a decoder
// skip what the crops throw away.
ImageCrop ImageTransforms::plan(int64_t width, int64_t height, uint64_t seed, int64_t epoch, int64_t index) const {
  detail::SampleRandom random(seed, epoch, index);
  Plane p{{0, 0, static_cast<double>(width), static_cast<double>(height), width, height, false}, width, height};
  for (const auto& step : steps_) {
    if (const auto* t = std::get_if<Resize>(&step)) {
      std::tie(p.width, p.height) = resized(t->size, p.width, p.height);
    } else if (const auto* c = std::get_if<CenterCrop>(&step)) {
      center_crop(p, c->size);
    } else if (const auto* r = std::get_if<RandomResizedCrop>(&step)) {
      random_resized_crop(p, *r, random);
    } else if (const auto* f = std::get_if<RandomHorizontalFlip>(&step)) {
      if (random.uniform(0.0, 1.0) < f->p) p.crop.flip = !p.crop.flip;
    }
  }
  p.crop.out_width = p.width;
  p.crop.out_height = p.height;
  return p.crop;
}

DecodeRequest ImageTransforms::request(const ImageCrop& crop) const {
  return {output_.channels, crop.width, crop.height, crop.out_width, crop.out_height, crop.x, crop.y};
}

void ImageTransforms::apply(const DecodedImage& image, const ImageCrop& crop, void* out) const {
  if (image.channels != output_.channels)
    throw ConfigError(fmt::format("ImageTransforms: an image of {} channels given for {} channel output",
                                  image.channels, output_.channels));
  const double s = image.scale;
  const auto xs =
      detail::axis_taps((crop.x - static_cast<double>(image.x)) * s, crop.width * s, image.width, crop.out_width);
  const auto ys =
      detail::axis_taps((crop.y - static_cast<double>(image.y)) * s, crop.height * s, image.height, crop.out_height);
  const int64_t plane = crop.out_width * crop.out_height, n = plane * output_.channels;
  if (output_.dtype == torch::kFloat) {
    auto* f = static_cast<float*>(out);
    detail::resample(image.pixels.data(), image.width, image.channels, xs, ys, crop.flip, f);
    for (int64_t c = 0; c < output_.channels; ++c) {
      const float mean = mean_.empty() ? 0.0f : mean_[static_cast<size_t>(c)];
      const float k = (mean_.empty() ? 1.0f : inv_std_[static_cast<size_t>(c)]) / 255.0f;
      for (int64_t i = c * plane; i < (c + 1) * plane; ++i) f[i] = f[i] * k - mean * (k * 255.0f);
    }
    return;
  }
  std::vector<float> values(static_cast<size_t>(n));
  detail::resample(image.pixels.data(), image.width, image.channels, xs, ys, crop.flip, values.data());
  auto* b = static_cast<uint8_t*>(out);
  for (int64_t i = 0; i < n; ++i)
    b[i] = static_cast<uint8_t>(std::clamp(std::nearbyint(values[static_cast<size_t>(i)]), 0.0f, 255.0f));
}

torch::Tensor ImageTransforms::operator()(const DecodedImage& image, const ImageCrop& crop) const {
  torch::Tensor out = torch::empty({output_.channels, crop.out_height, crop.out_width}, torch::dtype(output_.dtype));
  apply(image, crop, out.data_ptr());
  return out;
}

}  // namespace fulgor
