#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <variant>
#include <vector>

#include "fulgor/core/export.h"
#include "fulgor/data/image_decode.h"

namespace fulgor {

// The transforms of torchvision.transforms with their parameters and
// meanings (torchvision 0.14 to 0.21, antialiased as the v2 transforms and
// PIL images are). `size` is {s} or {height, width}, as torchvision's int or
// sequence.

/// {s}: the smaller edge to s, the aspect ratio kept (the larger edge
/// int(s * long / short)); {h, w}: to exactly h x w. Bilinear, antialiased.
struct Resize {
  std::vector<int64_t> size;
};
/// The center h x w, at top int(round((H - h) / 2)) and left likewise
/// (Python's round: halves to even); padded with zeros where the image is
/// smaller, as torchvision pads.
struct CenterCrop {
  std::vector<int64_t> size;
};
/// torchvision's get_params: up to 10 draws of an area fraction in `scale`
/// and a log-uniform aspect ratio in `ratio`, the first that fits at a
/// uniform position, else the center crop clamped to `ratio`; then resized
/// to `size` (bilinear, antialiased).
struct RandomResizedCrop {
  std::vector<int64_t> size;
  std::array<double, 2> scale{0.08, 1.0};
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};
};
/// Mirrors left to right with probability p.
struct RandomHorizontalFlip {
  double p = 0.5;
};
/// (x - mean) / std per channel, on values in [0, 1] (after ToTensor);
/// mean and std have one value, or one per channel. Float output only.
struct Normalize {
  std::vector<double> mean;
  std::vector<double> std;
};

using ImageTransform = std::variant<Resize, CenterCrop, RandomResizedCrop, RandomHorizontalFlip, Normalize>;

/// What a pipeline makes: channels (1 gray, 3 RGB) and the tensor's type:
/// kFloat (ToTensor's [0, 1], then Normalize) or kByte (0..255).
struct ImageOutput {
  int64_t channels = 3;
  torch::Dtype dtype = torch::kFloat;
};

/// Where one sample's output comes from: a rectangle of the full image (in
/// its pixels; it may reach past the image where a CenterCrop pads), the
/// output's size, and whether it is mirrored.
struct ImageCrop {
  double x = 0, y = 0, width = 0, height = 0;
  int64_t out_width = 0, out_height = 0;
  bool flip = false;
};

/// A torchvision-style pipeline over decoded images, to one fixed output size
/// (what a batch needs). The geometric transforms compose into one rectangle
/// of the source image and one resampling (Note [One resampling] in
/// src/data/image_transforms.cpp), so that a decoder need only decode what
/// the rectangle keeps, at the smallest scale that still covers the output.
///
/// Every random choice is a function of (seed, epoch, index): a sample's crop
/// and flip do not depend on threads, timing or the order samples are made.
///
/// Requires: the geometric transforms end at a fixed size (a CenterCrop, a
/// RandomResizedCrop or a Resize to {h, w}, last among them); Normalize only
/// with float output, after the geometric transforms. Throws ConfigError
/// naming the transform otherwise.
class FULGOR_API ImageTransforms {
 public:
  explicit ImageTransforms(std::vector<ImageTransform> steps, ImageOutput output = {});

  int64_t channels() const { return output_.channels; }
  torch::Dtype dtype() const { return output_.dtype; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }

  /// The crop of sample `index` in `epoch` from a width x height image.
  ImageCrop plan(int64_t width, int64_t height, uint64_t seed, int64_t epoch, int64_t index) const;
  /// What to ask a decoder for, given the plan.
  DecodeRequest request(const ImageCrop& crop) const;
  /// Writes the output of `image` for `crop` (channels x height x width of
  /// dtype(), contiguous) to `out`. Thread-safe.
  void apply(const DecodedImage& image, const ImageCrop& crop, void* out) const;
  /// apply into a new tensor [channels, height, width].
  torch::Tensor operator()(const DecodedImage& image, const ImageCrop& crop) const;

 private:
  std::vector<ImageTransform> steps_;
  ImageOutput output_;
  int64_t height_ = 0, width_ = 0;
  std::vector<float> mean_, inv_std_;  // per channel; empty: no Normalize
};

}  // namespace fulgor
