#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// A sample that cannot be read or decoded: a corrupt or truncated image, a
/// format fulgor does not decode, a file or shard member that is missing.
/// The message names the sample.
class FULGOR_API DataError : public Error {
 public:
  using Error::Error;
};

enum class ImageFormat { jpeg, png };

/// Note [Images from elsewhere]
/// The most pixels (width x height) an image may declare: a header of a few
/// bytes can declare 60000 x 60000 pixels, 10 GB to decode. PIL refuses
/// images above twice its Image.MAX_IMAGE_PIXELS (89478485) as decompression
/// bombs; this is the same 178956970, about 13377 x 13377, 512 MiB as RGB.
/// Raise it with ImageDecoder's constructor or
/// ImageLoaderOptions::max_image_pixels.
constexpr int64_t kDefaultMaxImagePixels = 2 * 89478485;

/// What an encoded image's header says.
struct ImageHeader {
  ImageFormat format = ImageFormat::jpeg;
  int64_t width = 0;
  int64_t height = 0;
};

/// Pixels as rows of interleaved channels (HWC), 8 bits a channel: 1
/// (gray) or 3 (RGB). A decoder may scale while decoding (a JPEG's DCT
/// scaling) and decode only a part of the image (a JPEG's DCT-domain crop):
/// `scale` is decoded pixels per pixel of the full image and (x, y) the
/// decoded part's top left corner in the full image, so that pixel (u, v)
/// of the full image is at ((u - x) * scale, (v - y) * scale) here.
struct DecodedImage {
  int64_t width = 0;
  int64_t height = 0;
  int64_t channels = 0;
  double scale = 1.0;
  std::vector<uint8_t> pixels;
  int64_t x = 0, y = 0;
};

/// What a decode is for: the image will be resampled to out_width x
/// out_height from a region of at least that size, so a JPEG may be decoded
/// at 1/2, 1/4 or 1/8 of its size (in the DCT, far cheaper than decoding it
/// whole) as long as the region stays at least the output's size, and only
/// the blocks around the region (Note [Decoding only the crop]) when `crop`.
struct DecodeRequest {
  int64_t channels = 3;  ///< 1 (gray) or 3 (RGB)
  /// The region's size in pixels of the full image; 0: the whole image.
  double region_width = 0;
  double region_height = 0;
  /// The size it is resampled to; 0: no scaling while decoding.
  int64_t out_width = 0;
  int64_t out_height = 0;
  /// The region's top left corner in the full image (it may lie outside).
  double region_x = 0;
  double region_y = 0;
  /// Decode only the region (and the margin its resampling reads) where
  /// that saves enough; false: the whole image.
  bool crop = true;
};

/// Decodes JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libpng) from memory.
/// A corrupt or truncated image, or data in another format, is a DataError
/// naming `name`; libjpeg-turbo's warnings (corrupt data it would decode as
/// gray) count as errors, as PIL refuses truncated images.
///
/// An image that declares more than `max_pixels` pixels is a DataError
/// naming the image and the limit, from its header, before anything is
/// decoded (Note [Images from elsewhere]).
///
/// Not thread-safe: one decoder per thread (it keeps TurboJPEG's handles and
/// their buffers).
class FULGOR_API ImageDecoder {
 public:
  explicit ImageDecoder(int64_t max_pixels = kDefaultMaxImagePixels);
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  /// The format and size, from the header alone.
  ImageHeader header(const uint8_t* data, size_t size, const std::string& name);
  /// Decodes into `out` (its buffer reused).
  void decode(const uint8_t* data, size_t size, const std::string& name, const DecodeRequest& request,
              DecodedImage& out);

 private:
  void check_pixels(int64_t width, int64_t height, const std::string& name) const;
  int64_t max_pixels_;
  void* turbojpeg_;                   // tjhandle, a decompressor
  void* transformer_;                 // tjhandle, for DCT-domain crops
  unsigned char* cropped_ = nullptr;  // the cropped JPEG (tjAlloc'd, grown by TurboJPEG)
  unsigned long cropped_size_ = 0;
};

/// The format of encoded bytes, from their signature; DataError naming
/// `name` for anything but JPEG and PNG.
FULGOR_API ImageFormat image_format(const uint8_t* data, size_t size, const std::string& name);

}  // namespace fulgor
