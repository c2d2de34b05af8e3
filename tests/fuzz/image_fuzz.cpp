// Image files, decoded as the image folder and tar shard loaders decode them:
// JPEG and PNG, whole, and scaled and cropped as a random resized crop asks.

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/data/image_decode.h"
#include "fuzz.h"

namespace fulgor::fuzz {
namespace {

// The pixel limit in force (Note [Images from elsewhere]), lowered from the
// default so that an input costs milliseconds rather than a 512 MiB buffer:
// the seeds declaring more pixels than the default are refused the same way.
constexpr int64_t kFuzzMaxPixels = int64_t{1} << 22;

void check_whole(ImageDecoder& decoder, const uint8_t* data, size_t size, const ImageHeader& head, int64_t channels) {
  DecodedImage out;
  try {
    decoder.decode(data, size, "fuzz input", {channels}, out);
  } catch (const Error&) {
    return;
  }
  require(out.width == head.width && out.height == head.height, "a whole decode has the header's size");
  require(out.channels == channels && out.scale == 1.0 && out.x == 0 && out.y == 0,
          "a whole decode has the channels asked for, at full scale");
  require(out.pixels.size() == static_cast<size_t>(out.width * out.height * channels), "the pixels fill the image");
}

// The loaders' request: the centre quarter, resampled to an eighth of the
// image's size, which a JPEG may decode scaled and cut to the region.
void check_region(ImageDecoder& decoder, const uint8_t* data, size_t size, const ImageHeader& head) {
  DecodeRequest request;
  request.region_x = head.width / 4.0;
  request.region_y = head.height / 4.0;
  request.region_width = head.width / 2.0;
  request.region_height = head.height / 2.0;
  request.out_width = std::max<int64_t>(head.width / 8, 1);
  request.out_height = std::max<int64_t>(head.height / 8, 1);
  DecodedImage out;
  try {
    decoder.decode(data, size, "fuzz input", request, out);
  } catch (const Error&) {
    return;
  }
  require(out.channels == 3 && out.pixels.size() == static_cast<size_t>(out.width * out.height * 3),
          "the pixels fill the decoded part");
  require(out.scale > 0 && out.scale <= 1 && out.width >= request.out_width && out.height >= request.out_height,
          "a scaled decode keeps at least the output's size");
  require(out.x >= 0 && out.y >= 0 && out.x <= request.region_x && out.y <= request.region_y &&
              out.x + out.width / out.scale >= request.region_x + request.region_width &&
              out.y + out.height / out.scale >= request.region_y + request.region_height,
          "the decoded part holds the region");
  require(out.x + (out.width - 1) / out.scale < head.width && out.y + (out.height - 1) / out.scale < head.height,
          "the decoded part lies within the image");
}

// A smooth picture (gradients, as photos are), HWC.
std::vector<uint8_t> picture(int width, int height, int channels, int bytes_per_channel = 1) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * channels * bytes_per_channel));
  for (size_t i = 0; i < pixels.size(); ++i) {
    const size_t pixel = i / static_cast<size_t>(channels * bytes_per_channel);
    pixels[i] = static_cast<uint8_t>(pixel % static_cast<size_t>(width) * 255 / width +
                                     pixel / static_cast<size_t>(width) * 97 / height + i % 3 * 50);
  }
  return pixels;
}

void write_bytes(const std::string& path, const void* data, size_t size) {
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}

void write_jpeg(const std::string& path, int width, int height, int subsampling, int flags) {
  const int channels = subsampling == TJSAMP_GRAY ? 1 : 3;
  const auto pixels = picture(width, height, channels);
  tjhandle compressor = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int status = tjCompress2(compressor, pixels.data(), width, 0, height, channels == 1 ? TJPF_GRAY : TJPF_RGB,
                                 &jpeg, &size, subsampling, 90, flags);
  require(status == 0, "TurboJPEG encodes a seed");
  write_bytes(path, jpeg, size);
  tjFree(jpeg);
  tjDestroy(compressor);
}

void write_png(const std::string& path, int width, int height, png_uint_32 format) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = format;
  const int channels = static_cast<int>(PNG_IMAGE_SAMPLE_CHANNELS(format));
  const auto pixels = picture(width, height, channels, static_cast<int>(PNG_IMAGE_SAMPLE_COMPONENT_SIZE(format)));
  std::vector<png_byte> colormap;
  if (format & PNG_FORMAT_FLAG_COLORMAP) {  // a gray ramp, as 256 RGB entries
    image.colormap_entries = 256;
    for (int i = 0; i < 256 * 3; ++i) colormap.push_back(static_cast<png_byte>(i / 3));
  }
  png_alloc_size_t size = 0;
  require(png_image_write_get_memory_size(image, size, 0, pixels.data(), 0, colormap.data()) != 0,
          "libpng sizes a seed");
  std::vector<uint8_t> png(size);
  require(png_image_write_to_memory(&image, png.data(), &size, 0, pixels.data(), 0, colormap.data()) != 0,
          "libpng encodes a seed");
  write_bytes(path, png.data(), size);
}

}  // namespace

void write_image_seeds(const std::string& folder) {
  write_jpeg(folder + "/valid_420.jpg", 40, 30, TJSAMP_420, 0);
  write_jpeg(folder + "/valid_444.jpg", 17, 9, TJSAMP_444, 0);
  write_jpeg(folder + "/valid_422.jpg", 33, 64, TJSAMP_422, 0);
  write_jpeg(folder + "/valid_gray.jpg", 24, 24, TJSAMP_GRAY, 0);
  write_jpeg(folder + "/valid_progressive.jpg", 48, 40, TJSAMP_420, TJFLAG_PROGRESSIVE);
  write_jpeg(folder + "/valid_1x1.jpg", 1, 1, TJSAMP_444, 0);
  write_png(folder + "/valid_rgb.png", 20, 12, PNG_FORMAT_RGB);
  write_png(folder + "/valid_rgba.png", 9, 7, PNG_FORMAT_RGBA);
  write_png(folder + "/valid_gray.png", 16, 16, PNG_FORMAT_GRAY);
  write_png(folder + "/valid_gray_alpha.png", 5, 11, PNG_FORMAT_GA);
  write_png(folder + "/valid_rgb_16bit.png", 8, 8, PNG_FORMAT_LINEAR_RGB);
  write_png(folder + "/valid_palette.png", 13, 6, PNG_FORMAT_RGB_COLORMAP);
  write_png(folder + "/valid_1x1.png", 1, 1, PNG_FORMAT_RGB);
}

void image(const uint8_t* data, size_t size) {
  // One decoder, as each loader thread keeps one, so that its reused
  // buffers meet inputs of every size.
  static ImageDecoder decoder(kFuzzMaxPixels);
  ImageHeader head;
  try {
    head = decoder.header(data, size, "fuzz input");
  } catch (const Error&) {
    return;
  }
  require(head.width >= 1 && head.height >= 1 && head.width * head.height <= kFuzzMaxPixels,
          "a header taken declares pixels within the limit");
  check_whole(decoder, data, size, head, 3);
  check_whole(decoder, data, size, head, 1);
  check_region(decoder, data, size, head);
}

}  // namespace fulgor::fuzz

FULGOR_FUZZ_TARGET(fulgor::fuzz::image)
