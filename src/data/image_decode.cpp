#include "fulgor/data/image_decode.h"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

namespace fulgor {
namespace {

bool has_jpeg_signature(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

bool has_png_signature(const uint8_t* data, size_t size) { return size >= 8 && png_sig_cmp(data, 0, 8) == 0; }

void require_channels(int64_t channels) {
  if (channels != 1 && channels != 3)
    throw ConfigError(fmt::format("image channels={} is not valid: 1 (gray) or 3 (RGB)", channels));
}

// Note [Decoding at a smaller scale]
// libjpeg-turbo can scale by n/8 inside the inverse DCT, skipping most of its
// work at 1/2, 1/4 or 1/8. The smallest such scale that keeps the region at
// least the output's size loses nothing the resampling after it would keep
// (it averages those pixels away), as FFCV and DALI decode.
tjscalingfactor jpeg_scaling(int width, int height, const DecodeRequest& request) {
  tjscalingfactor best{1, 1};
  if (request.out_width <= 0 || request.out_height <= 0) return best;
  const double region_w = request.region_width > 0 ? request.region_width : width;
  const double region_h = request.region_height > 0 ? request.region_height : height;
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  for (int i = 0; i < count; ++i) {
    const tjscalingfactor f = factors[i];
    const double s = static_cast<double>(f.num) / f.denom;
    if (s >= static_cast<double>(best.num) / best.denom) continue;
    if (region_w * s >= static_cast<double>(request.out_width) &&
        region_h * s >= static_cast<double>(request.out_height))
      best = f;
  }
  return best;
}

// Note [Decoding only the crop]
// A JPEG's blocks can be cut out without decoding them (TurboJPEG's lossless
// tjTransform with TJXOPT_CROP, as FFCV crops): the kept blocks' coefficients
// are copied into a smaller JPEG, which is then decoded. The cut's left and
// top edges fall on the MCU grid (8 to 32 pixels), and it keeps a margin
// around the region: the resampling filter's reach, and the chroma
// upsampling's, which blends a block with its neighbours. Inside that margin
// the pixels are those of the whole decoded image (tested), so the resampled
// output is too. The cut costs an entropy decode of the whole image and an
// encode of the kept part, so it pays only where the inverse DCT and colour
// conversion it saves are large: at full scale (a scaled decode already
// skips most of them) and for a small part of the image (measured on the
// benchmark's 500x375 JPEGs: 1.4x faster at a tenth of the area, even at a
// third, slower beyond; slower at every area at scale 1/2).
// libjpeg-turbo 2.1 (Debian 12 and 13 alike) has no other crop in its
// TurboJPEG API; 3.0's tj3SetCroppingRegion would crop in the decompressor,
// without the re-encoding.
constexpr double kCropWorthIt = 0.25;  // of the image's area

std::optional<tjregion> jpeg_crop(int width, int height, int subsampling, double scale, const DecodeRequest& request) {
  if (!request.crop || scale != 1.0 || request.region_width <= 0 || request.region_height <= 0 ||
      request.out_width <= 0 || request.out_height <= 0 || subsampling < 0 || subsampling >= TJ_NUMSAMP)
    return std::nullopt;
  // In full-image pixels: the filter's support (a decoded pixel at least)
  // and two more decoded pixels for the chroma upsampling and rounding.
  const double reach_x = std::max(request.region_width / request.out_width, 1.0 / scale) + 3.0 / scale;
  const double reach_y = std::max(request.region_height / request.out_height, 1.0 / scale) + 3.0 / scale;
  const int mcu_w = tjMCUWidth[subsampling], mcu_h = tjMCUHeight[subsampling];
  auto span = [](double from, double extent, double reach, int mcu, int size) {
    const double lo = std::clamp(std::floor(from - reach), 0.0, static_cast<double>(size));
    const double hi = std::clamp(std::ceil(from + extent + reach), 0.0, static_cast<double>(size));
    const int first = static_cast<int>(lo) / mcu * mcu;
    return std::pair<int, int>{first, std::max(static_cast<int>(hi) - first, 0)};
  };
  const auto [x, w] = span(request.region_x, request.region_width, reach_x, mcu_w, width);
  const auto [y, h] = span(request.region_y, request.region_height, reach_y, mcu_h, height);
  if (w <= 0 || h <= 0 || static_cast<double>(w) * h > kCropWorthIt * width * height) return std::nullopt;
  return tjregion{x, y, w, h};
}

struct JpegHeader {
  int width, height, subsampling;
};

JpegHeader jpeg_header(tjhandle decompressor, const uint8_t* data, size_t size, const std::string& name) {
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(decompressor, data, static_cast<unsigned long>(size), &width, &height, &subsampling,
                          &colorspace) != 0)
    throw DataError(fmt::format("{}: not a valid JPEG image ({})", name, tjGetErrorStr2(decompressor)));
  // A JPEG cut before its frame header, or holding only tables, passes
  // tjDecompressHeader3 (with a warning) without a size.
  if (width < 1 || height < 1)
    throw DataError(fmt::format("{}: not a valid JPEG image (it ends before its frame header and size)", name));
  return {width, height, subsampling};
}

ImageHeader png_header(const uint8_t* data, size_t size, const std::string& name) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data, size))
    throw DataError(fmt::format("{}: not a valid PNG image ({})", name, image.message));
  png_image_free(&image);
  return {ImageFormat::png, image.width, image.height};
}

void decode_png(const uint8_t* data, size_t size, const std::string& name, int64_t channels, DecodedImage& out) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data, size))
    throw DataError(fmt::format("{}: not a valid PNG image ({})", name, image.message));
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  // An alpha channel is composited onto the buffer: zeroed, onto black.
  out.pixels.assign(PNG_IMAGE_SIZE(image), 0);
  if (!png_image_finish_read(&image, nullptr, out.pixels.data(), 0, nullptr)) {
    const std::string why = image.message;
    png_image_free(&image);
    throw DataError(fmt::format("{}: corrupt or truncated PNG image ({})", name, why));
  }
  out.width = image.width;
  out.height = image.height;
  out.channels = channels;
  out.scale = 1.0;
  out.x = out.y = 0;
}

}  // namespace

ImageFormat image_format(const uint8_t* data, size_t size, const std::string& name) {
  if (has_jpeg_signature(data, size)) return ImageFormat::jpeg;
  if (has_png_signature(data, size)) return ImageFormat::png;
  throw DataError(fmt::format("{}: not a JPEG or PNG image ({} bytes; fulgor decodes JPEG and PNG)", name, size));
}

ImageDecoder::ImageDecoder(int64_t max_pixels)
    : max_pixels_(max_pixels), turbojpeg_(tjInitDecompress()), transformer_(tjInitTransform()) {
  if (max_pixels < 1) throw ConfigError(fmt::format("max_pixels={} is not valid: >= 1", max_pixels));
  if (!turbojpeg_ || !transformer_) {
    const std::string why = tjGetErrorStr2(nullptr);
    if (turbojpeg_) tjDestroy(turbojpeg_);
    if (transformer_) tjDestroy(transformer_);
    throw Error(fmt::format("TurboJPEG could not start a decompressor: {}", why));
  }
}

ImageDecoder::~ImageDecoder() {
  tjDestroy(turbojpeg_);
  tjDestroy(transformer_);
  tjFree(cropped_);
}

void ImageDecoder::check_pixels(int64_t width, int64_t height, const std::string& name) const {
  if (width * height > max_pixels_)
    throw DataError(fmt::format("{}: declares {} x {} = {} pixels, more than the limit of {} (a decompression bomb, "
                                "as PIL calls it; raise ImageLoaderOptions::max_image_pixels for larger images)",
                                name, width, height, width * height, max_pixels_));
}

ImageHeader ImageDecoder::header(const uint8_t* data, size_t size, const std::string& name) {
  ImageHeader head;
  if (image_format(data, size, name) == ImageFormat::png) {
    head = png_header(data, size, name);
  } else {
    const JpegHeader jpeg = jpeg_header(turbojpeg_, data, size, name);
    head = {ImageFormat::jpeg, jpeg.width, jpeg.height};
  }
  check_pixels(head.width, head.height, name);
  return head;
}

void ImageDecoder::decode(const uint8_t* data, size_t size, const std::string& name, const DecodeRequest& request,
                          DecodedImage& out) {
  require_channels(request.channels);
  const ImageFormat format = image_format(data, size, name);
  if (format == ImageFormat::png) {
    const ImageHeader head = png_header(data, size, name);
    check_pixels(head.width, head.height, name);
    return decode_png(data, size, name, request.channels, out);
  }
  auto [width, height, subsampling] = jpeg_header(turbojpeg_, data, size, name);
  check_pixels(width, height, name);
  // The scale is chosen for the region, whether or not it is cut out.
  const tjscalingfactor scaling = jpeg_scaling(width, height, request);
  const double scale = static_cast<double>(scaling.num) / scaling.denom;
  out.x = out.y = 0;
  if (const auto region = jpeg_crop(width, height, subsampling, scale, request)) {
    tjtransform transform{};
    transform.r = *region;
    transform.op = TJXOP_NONE;
    transform.options = TJXOPT_CROP | TJXOPT_COPYNONE;
    if (tjTransform(transformer_, data, static_cast<unsigned long>(size), 1, &cropped_, &cropped_size_, &transform,
                    TJFLAG_STOPONWARNING) != 0)
      throw DataError(fmt::format("{}: corrupt or truncated JPEG image ({})", name, tjGetErrorStr2(transformer_)));
    data = cropped_;
    size = cropped_size_;
    width = region->w;
    height = region->h;
    out.x = region->x;
    out.y = region->y;
  }
  const int scaled_w = TJSCALED(width, scaling), scaled_h = TJSCALED(height, scaling);
  out.pixels.resize(static_cast<size_t>(scaled_w) * scaled_h * request.channels);
  const int pixel_format = request.channels == 1 ? TJPF_GRAY : TJPF_RGB;
  if (tjDecompress2(turbojpeg_, data, static_cast<unsigned long>(size), out.pixels.data(), scaled_w, 0, scaled_h,
                    pixel_format, TJFLAG_STOPONWARNING) != 0)
    throw DataError(fmt::format("{}: corrupt or truncated JPEG image ({})", name, tjGetErrorStr2(turbojpeg_)));
  out.width = scaled_w;
  out.height = scaled_h;
  out.channels = request.channels;
  out.scale = scale;
}

}  // namespace fulgor
